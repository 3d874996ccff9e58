"""Per-request latency objectives: llm-d's SLO headers, in seconds.

``x-llm-d-slo-ttft-ms`` and ``x-llm-d-slo-tpot-ms`` (and their deprecated aliases ``x-slo-ttft-ms`` and
``x-slo-tpot-ms``): positive numbers of milliseconds; anything else is ignored (the request has no such
objective). Read by the ``latency-scorer`` (headroom) and the ``slo-deadline-ordering-policy`` (flow control).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from picker.request import headers as hdr
from picker.request.model import InferenceRequest

__all__ = ["Slo", "slo_of"]


@dataclass(frozen=True, slots=True)
class Slo:
    """A request's latency objectives in seconds (None: not set)."""

    ttft_s: float | None
    tpot_s: float | None


def _seconds(headers: Mapping[str, str], name: str, alias: str) -> float | None:
    raw = headers.get(name) or headers.get(alias)
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value / 1000.0 if 0.0 < value < float("inf") else None


def slo_of(req: InferenceRequest) -> Slo | None:
    """The request's SLO headers; None when it sets none that parse."""
    ttft = _seconds(req.headers, hdr.SLO_TTFT, hdr.SLO_TTFT_DEPRECATED)
    tpot = _seconds(req.headers, hdr.SLO_TPOT, hdr.SLO_TPOT_DEPRECATED)
    return None if ttft is None and tpot is None else Slo(ttft, tpot)
