"""llm-d's disaggregation metric: how each request was split, by model (the reference name and labels).

``llm_d_inference_scheduler_disagg_decision_total{model_name, decision_type}``, decision_type one of
``decode-only``, ``prefill-decode``, ``encode-decode``, ``encode-prefill-decode``; counted once per scheduling
cycle by the disaggregation profile handler.
"""

from __future__ import annotations

from prometheus_client import Counter

from picker.telemetry import REGISTRY

__all__ = ["DECISIONS", "DECODE_ONLY", "DISAGG_DECISIONS", "ENCODE_DECODE", "ENCODE_PREFILL_DECODE", "PREFILL_DECODE"]

DECODE_ONLY, PREFILL_DECODE = "decode-only", "prefill-decode"
ENCODE_DECODE, ENCODE_PREFILL_DECODE = "encode-decode", "encode-prefill-decode"
DECISIONS = (DECODE_ONLY, PREFILL_DECODE, ENCODE_DECODE, ENCODE_PREFILL_DECODE)

# prometheus_client appends ``_total`` to counter names itself.
DISAGG_DECISIONS = Counter(
    "llm_d_inference_scheduler_disagg_decision",
    "Disaggregation decisions per request: decode-only, prefill-decode, encode-decode, encode-prefill-decode.",
    ("model_name", "decision_type"),
    registry=REGISTRY,
)
