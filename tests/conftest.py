"""Shared builders: endpoint(), request(), FakeClock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.request.model import ApiKind, InferenceRequest


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def endpoint(
    i: int = 1,
    *,
    port: int = 8000,
    waiting: int = 0,
    running: int = 0,
    kv: float = 0.0,
    loras: tuple[str, ...] = (),
    waiting_loras: tuple[str, ...] = (),
    max_loras: int = 0,
    labels: Mapping[str, str] | None = None,
    updated_at: float = 1000.0,
    excluded: bool = False,
    own_requests: int | None = None,
) -> Endpoint:
    """Endpoint ``192.168.1.<i>:<port>`` with the given scraped metrics (reference test numbering)."""
    ep = Endpoint.create(f"192.168.1.{i}", port, labels=labels)
    metrics = EndpointMetrics(
        waiting=waiting,
        running=running,
        kv_usage=kv,
        running_loras=frozenset(loras),
        waiting_loras=frozenset(waiting_loras),
        max_loras=max_loras,
        updated_at=updated_at,
        own_requests=own_requests,
    )
    return Endpoint(
        key=ep.key,
        address=ep.address,
        port=ep.port,
        name=ep.name,
        metrics_url=ep.metrics_url,
        engine=ep.engine,
        labels=ep.labels,
        metrics=metrics,
        excluded=excluded,
    )


def request(model: str = "my-model", prompt: str = "hello", **kw: Any) -> InferenceRequest:
    fields: dict[str, Any] = {
        "request_id": "test-request-id",
        "api": ApiKind.COMPLETIONS,
        "model": model,
        "target_model": kw.pop("target_model", model),
        "prompt_text": prompt,
        "prompt_tokens": max(1, len(prompt) // 4),
    }
    fields.update(kw)
    return InferenceRequest(**fields)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
