"""Helpers for admission tests: a settable saturation detector and request builders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest
from tests.conftest import request


class Gate:
    """A saturation detector the test sets by hand (or computes from a callable)."""

    type = "test-detector"
    name = "gate"

    def __init__(self, value: float = 0.0) -> None:
        self.value = value
        self.calls = 0

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        self.calls += 1
        return self.value


def req(flow: str = "default-flow", priority: int = 0, **kw: Any) -> InferenceRequest:
    return request(fairness_id=flow, priority=priority, body=kw.pop("body", b'{"model":"my-model"}'), **kw)
