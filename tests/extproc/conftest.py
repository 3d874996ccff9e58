"""Fixtures for the protocol tests: a real picker (127.0.0.1, ephemeral ports) over a static store.

Every test here runs twice, once per ext_proc front (``--grpc-frontend``): the native one (picker.extproc.native,
the default where it is built) and grpc.aio. The protocol is the same code behind both; the fronts must not differ.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import AsyncIterator, Iterable

import pytest

from picker.app import Running, serving
from picker.endpoints.model import Endpoint
from picker.endpoints.store import EndpointStore
from picker.settings import ServerSettings, Settings
from picker.telemetry import REGISTRY
from tests.scheduling.helpers import INTEGRATION

# The reference integration tests' scheduler: queue, KV, prefix and LoRA scorers, weight 1 each.
REFERENCE_CONFIG = INTEGRATION


FRONTENDS = ("native", "grpc")
_FRONTEND_ENV = "PICKER_TEST_GRPC_FRONTEND"


@pytest.fixture(autouse=True, params=FRONTENDS)
def grpc_frontend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ext_proc front ``settings()`` selects for this test."""
    frontend = str(request.param)
    monkeypatch.setenv(_FRONTEND_ENV, frontend)
    return frontend


def make_store(endpoints: Iterable[Endpoint], *, synced: bool = True) -> EndpointStore:
    store = EndpointStore()
    store.set_endpoints(list(endpoints), synced=synced)
    return store


def settings(**server: object) -> Settings:
    base = ServerSettings(
        host="127.0.0.1",
        grpc_port=0,
        health_port=0,
        metrics_port=0,
        secure_serving=False,
        termination_grace_s=2.0,
        grpc_frontend=os.environ.get(_FRONTEND_ENV, "auto"),
    )
    return Settings(server=dataclasses.replace(base, **server), config_text=REFERENCE_CONFIG)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def picker(store: EndpointStore, **server: object) -> AsyncIterator[Running]:
    """A started picker serving ``store`` (no scraping: tests set metrics directly)."""
    async with serving(settings(**server), store=store, scrape=False) as running:
        yield running


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    """The current value of one series in picker's registry (0 if it was never set)."""
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0
