"""Per-request metrics: the director's one place that touches ``telemetry.metrics``.

Labels follow the reference: ``model_name`` is what the client asked for, ``target_model_name`` what was sent
upstream after any rewrite. Header-only requests have an empty model name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterable

from picker import errors
from picker.request.model import InferenceRequest
from picker.scheduling.framework import PluginTiming, SchedulingResult
from picker.telemetry import labels
from picker.telemetry import metrics as m
from picker.telemetry.fast import Children

__all__ = [
    "completed",
    "expired",
    "failed",
    "plugin_timings",
    "released",
    "routed",
    "scheduled",
    "scheduling_failed",
]


# Cached label children: this runs several times per request.
_request_total = Children(m.REQUEST_TOTAL)
_running = Children(m.RUNNING_REQUESTS)
_attempts = Children(m.SCHEDULER_ATTEMPTS)
_errors = Children(m.REQUEST_ERRORS)
_scheduling_errors = Children(m.SCHEDULING_ERRORS)
_ejections = Children(m.ENDPOINT_EJECTIONS)

_model = labels.MODELS  # client-chosen names: bounded (telemetry/labels.py)


def _models_of(req: InferenceRequest) -> tuple[str, str]:
    return _model(req.model), _model(req.target_model)


def scheduled(req: InferenceRequest, result: SchedulingResult) -> None:
    m.SCHEDULER_E2E.observe(result.duration_s)
    primary = result.targets[0] if result.targets else None
    if primary is not None:
        _attempts(
            "success", _model(req.target_model), primary.name, primary.labels.get("namespace", ""), str(primary.port)
        ).inc()
    plugin_timings(result.plugin_timings)


def plugin_timings(timings: Iterable[PluginTiming]) -> None:
    for t in timings:
        m.PLUGIN_DURATION.labels(t.extension_point, t.plugin_type, t.plugin_name).observe(t.seconds)


def scheduling_failed(req: InferenceRequest) -> None:
    _attempts("failure", _model(req.target_model), "", "", "").inc()


def routed(req: InferenceRequest) -> None:
    model, target = _models_of(req)
    _request_total(model, target, str(req.priority)).inc()
    _running(model).inc()
    if req.body:
        m.REQUEST_SIZES.labels(model, target).observe(len(req.body))


def released(req: InferenceRequest) -> None:
    _running(_model(req.model)).dec()


def failed(err: errors.PickerError, req: InferenceRequest | None) -> None:
    model, target = _models_of(req) if req is not None else ("", "")
    _errors(model, target, err.code).inc()
    _scheduling_errors(err.code).inc()


def completed(
    req: InferenceRequest,
    *,
    duration_s: float,
    response_bytes: int,
    prompt_tokens: int | None,
    completion_tokens: int | None,
    cached_tokens: int | None,
) -> None:
    labels = _models_of(req)
    m.REQUEST_DURATION.labels(*labels).observe(duration_s)
    m.RESPONSE_SIZES.labels(*labels).observe(response_bytes)
    if prompt_tokens is not None:
        m.INPUT_TOKENS.labels(*labels).observe(prompt_tokens)
    if completion_tokens is not None:
        m.OUTPUT_TOKENS.labels(*labels).observe(completion_tokens)
        if completion_tokens > 0:
            m.NTPOT.labels(*labels).observe(duration_s / completion_tokens)
    if cached_tokens is not None:
        m.PROMPT_CACHED_TOKENS.labels(*labels).observe(cached_tokens)


def expired(count: int) -> None:
    m.INFLIGHT_EXPIRED.inc(count)


def ejected(endpoint_key: str) -> None:
    _ejections(endpoint_key).inc()


def forget_endpoints(keys: Collection[str], names: Collection[str]) -> int:
    """Drop the per-endpoint series of endpoints no longer in the pool (``keys``; pod ``names``): with pods
    coming and going they would pile up for good. Returns how many series were dropped."""
    dropped = _attempts.retain(lambda values: not values[2] or values[2] in names)
    return dropped + _ejections.retain(lambda values: values[0] in keys)


def suspect(endpoint_key: str, flag: bool) -> None:
    """An endpoint became suspected hung (True) or was readmitted or left the pool (False)."""
    if flag:
        m.ENDPOINT_SUSPICIONS.inc()
        m.ENDPOINT_SUSPECT.labels(endpoint_key).set(1)
        return
    with contextlib.suppress(KeyError):  # never suspect, or already removed
        m.ENDPOINT_SUSPECT.remove(endpoint_key)
