"""Flow-control metrics, named and labelled as the reference's (protocol.md §12).

* ``inference_extension_flow_control_request_queue_duration_seconds``: time from entering flow control to the
  outcome (``Dispatched``, ``RejectedCapacity``, ``EvictedTTL``, ``EvictedContextCancelled``), per fairness id,
  priority, outcome, pool and model.
* ``inference_extension_flow_control_queue_size`` / ``_queue_bytes``: requests (bytes) waiting now.
* ``inference_extension_flow_control_pool_saturation``: the pool's saturation at the last dispatch decision.

Updated by ``picker.admission.flow`` on the event loop only; a request that is dispatched without waiting counts
one ``Dispatched`` observation of 0 s.
"""

from __future__ import annotations

from prometheus_client import Gauge

from picker.telemetry import REGISTRY
from picker.telemetry.fast import FastHistogram

__all__ = [
    "DISPATCHED",
    "EVICTED_CANCELLED",
    "EVICTED_TTL",
    "POOL_SATURATION",
    "QUEUE_BYTES",
    "QUEUE_DURATION",
    "QUEUE_SIZE",
    "REJECTED_CAPACITY",
]

# Outcome label values, spelled as the reference's QueueOutcome.String().
DISPATCHED = "Dispatched"
REJECTED_CAPACITY = "RejectedCapacity"
EVICTED_TTL = "EvictedTTL"
EVICTED_CANCELLED = "EvictedContextCancelled"

_MODEL_LABELS = ("model_name", "target_model_name")
_QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

QUEUE_DURATION = FastHistogram(
    "inference_extension_flow_control_request_queue_duration_seconds",
    "Distribution of the total time requests spend in the EPP flow control layer, measured from the start of the "
    "EnqueueAndWait call until a final outcome is reached.",
    ("fairness_id", "priority", "outcome", "inference_pool", *_MODEL_LABELS),
    buckets=_QUEUE_BUCKETS,
    registry=REGISTRY,
)
QUEUE_SIZE = Gauge(
    "inference_extension_flow_control_queue_size",
    "Current number of requests being actively managed by the EPP flow control layer, from the start of the "
    "EnqueueAndWait call until a final outcome is reached.",
    ("fairness_id", "priority", "inference_pool", *_MODEL_LABELS),
    registry=REGISTRY,
)
QUEUE_BYTES = Gauge(
    "inference_extension_flow_control_queue_bytes",
    "Current size in bytes of all requests being actively managed by the EPP flow control layer.",
    ("fairness_id", "priority", "inference_pool", *_MODEL_LABELS),
    registry=REGISTRY,
)
POOL_SATURATION = Gauge(
    "inference_extension_flow_control_pool_saturation",
    "Current saturation level of the inference pool as seen by flow control (1.0 = saturated).",
    ("inference_pool",),
    registry=REGISTRY,
)
