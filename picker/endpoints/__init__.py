"""Endpoints: the immutable view of the model servers and picker's own in-flight accounting."""

from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint, EndpointMetrics, EndpointSnapshot, format_hostport
from picker.endpoints.store import EndpointStore

__all__ = [
    "Endpoint",
    "EndpointMetrics",
    "EndpointSnapshot",
    "EndpointStore",
    "InflightTracker",
    "format_hostport",
]
