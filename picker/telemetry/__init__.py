"""Telemetry: picker's own Prometheus metrics (reference names), logging, tracing.

All of picker's metrics live in ``REGISTRY`` (not prometheus_client's global default registry), so the
``/metrics`` endpoint exports exactly picker's series and tests can read them without interference.
"""

from prometheus_client import CollectorRegistry

REGISTRY = CollectorRegistry(auto_describe=True)

__all__ = ["REGISTRY"]
