"""Failure injection for reliability tests: errors by type, hangs, latency spikes, crashes.

Per request (in this order): a crash once ``crash_after`` requests have arrived; else an error with probability
``error_rate`` (type drawn from ``error_types``); else a hang with probability ``hang_rate`` (the connection stays
open without a byte for ``hang_s``, then is dropped). Per engine step: a latency spike with probability
``spike_rate`` stalls the whole batch for ``spike_s``. Decisions use a seeded RNG, so a run is repeatable.

The ``/metrics`` endpoint has faults of its own, for testing the scraper: ``metrics_delay_s`` before answering,
and ``metrics_mode`` ``garbage`` (a page that is not Prometheus text) or ``huge`` (the real page padded with
comment lines to ``metrics_huge_bytes``, sent chunked, so only the reader's own cap stops it).

Error types follow llm-d-inference-sim's names; their HTTP statuses are our choice (reference/model-servers.md §6).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ERROR_TYPES", "METRICS_MODES", "Crash", "ErrorReply", "FaultInjector", "Faults", "Hang"]

# type -> (HTTP status, OpenAI error type, message)
ERROR_TYPES: dict[str, tuple[int, str, str]] = {
    "rate_limit": (429, "RateLimitError", "Rate limit reached for requests (injected)"),
    "invalid_api_key": (401, "AuthenticationError", "Incorrect API key provided (injected)"),
    "context_length": (400, "BadRequestError", "This model's maximum context length is exceeded (injected)"),
    "server_error": (500, "InternalServerError", "The server had an error processing your request (injected)"),
    "invalid_request": (400, "BadRequestError", "Invalid request (injected)"),
    "model_not_found": (404, "NotFoundError", "The model does not exist (injected)"),
}


METRICS_MODES = ("ok", "garbage", "huge")


@dataclass(frozen=True, slots=True)
class Faults:
    error_rate: float = 0.0
    error_types: tuple[str, ...] = ("server_error",)
    hang_rate: float = 0.0
    hang_s: float = 30.0
    spike_rate: float = 0.0
    spike_s: float = 0.0
    crash_after: int | None = None  # requests; the N-th arrival crashes the server instead of being answered
    crash_down_s: float | None = None  # how long a crash keeps the port closed; None = until told to restart
    metrics_delay_s: float = 0.0  # /metrics answers after this long
    metrics_mode: str = "ok"  # ok | garbage | huge
    metrics_huge_bytes: int = 50 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("error_rate", "hang_rate", "spike_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1]")
        if self.hang_s < 0 or self.spike_s < 0 or (self.crash_down_s is not None and self.crash_down_s < 0):
            raise ValueError("durations must be >= 0")
        if self.metrics_delay_s < 0 or self.metrics_huge_bytes < 0:
            raise ValueError("metrics_delay_s and metrics_huge_bytes must be >= 0")
        if self.metrics_mode not in METRICS_MODES:
            raise ValueError(f"metrics_mode must be one of {', '.join(METRICS_MODES)}")
        if self.crash_after is not None and self.crash_after < 1:
            raise ValueError("crash_after must be >= 1")
        unknown = [t for t in self.error_types if t not in ERROR_TYPES]
        if unknown or not self.error_types:
            raise ValueError(f"error_types must be a non-empty subset of {', '.join(ERROR_TYPES)}; got {unknown}")

    def updated(self, changes: Mapping[str, Any]) -> Faults:
        """A copy with fields from a JSON object (the /admin/faults body); raises ValueError on bad input."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - names
        if unknown:
            raise ValueError(f"unknown fault fields: {', '.join(sorted(unknown))}")
        values = dict(changes)
        if "error_types" in values:
            types = values["error_types"]
            if isinstance(types, str):
                types = types.split(",")
            if not isinstance(types, list | tuple) or not all(isinstance(t, str) for t in types):
                raise ValueError("error_types must be a list of strings")
            values["error_types"] = tuple(t.strip() for t in types)
        for key, value in values.items():
            is_number = isinstance(value, int | float) and not isinstance(value, bool)
            if key == "metrics_mode":
                if not isinstance(value, str):
                    raise ValueError("metrics_mode must be a string")
            elif key != "error_types" and value is not None and not is_number:
                raise ValueError(f"{key} must be a number")
        return dataclasses.replace(self, **values)

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "error_types": list(self.error_types)}


@dataclass(frozen=True, slots=True)
class ErrorReply:
    status: int
    type: str
    message: str


@dataclass(frozen=True, slots=True)
class Hang:
    seconds: float


@dataclass(frozen=True, slots=True)
class Crash:
    down_s: float | None


class FaultInjector:
    """Draws fault decisions; ``faults`` may be swapped at run time."""

    def __init__(self, faults: Faults, *, seed: int = 0) -> None:
        self.faults = faults
        self._rng = random.Random(seed)
        self.requests = 0

    def on_request(self) -> ErrorReply | Hang | Crash | None:
        f = self.faults
        self.requests += 1
        if f.crash_after is not None and self.requests >= f.crash_after:
            self.requests = 0
            return Crash(f.crash_down_s)
        if f.error_rate and self._rng.random() < f.error_rate:
            status, kind, message = ERROR_TYPES[self._rng.choice(f.error_types)]
            return ErrorReply(status, kind, message)
        if f.hang_rate and self._rng.random() < f.hang_rate:
            return Hang(f.hang_s)
        return None

    def step_stall_s(self) -> float:
        f = self.faults
        if f.spike_rate and self._rng.random() < f.spike_rate:
            return f.spike_s
        return 0.0
