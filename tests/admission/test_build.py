"""build_admitter: shedding by default, flow control behind its feature gate; the package's exports."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from picker import admission, errors
from picker.endpoints.store import EndpointStore
from picker.scheduling.config import load_config
from tests.admission.helpers import req
from tests.conftest import endpoint
from tests.scheduling.helpers import HEAD, ctx


def test_without_the_gate_it_sheds() -> None:
    c = ctx()
    admitter = admission.build_admitter(load_config(None, c), c, store=EndpointStore(), shed_status=503)
    assert isinstance(admitter, admission.ShedAdmitter)
    assert admitter.shed_status == 503


async def test_with_the_gate_it_queues_and_follows_the_store() -> None:
    c = ctx()
    text = HEAD + (
        "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n"
        "flowControl: {defaultRequestTTL: 10s, maxRequests: 5}\n"
    )
    store = EndpointStore()
    now = c.clock()
    store.set_endpoints([endpoint(1, waiting=10, updated_at=now)])  # saturated: queue 10 / 5
    admitter = admission.build_admitter(load_config(text, c), c, store=store, pool_name="p")
    assert isinstance(admitter, admission.FlowController)
    assert (admitter.config.default_ttl_s, admitter.config.max_requests, admitter.pool_name) == (10.0, 5, "p")
    task = asyncio.create_task(admitter.admit(req(), ()))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not task.done()
    store.update_metrics({endpoint(1).key: endpoint(1, waiting=0, updated_at=now).metrics})  # subscribed
    await asyncio.wait_for(task, timeout=5.0)


def test_a_bad_flow_section_fails_at_build() -> None:
    c = ctx()
    text = HEAD + "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\nflowControl: {maxBytes: lots}\n"
    with pytest.raises(errors.ConfigError, match="maxBytes"):
        admission.build_admitter(load_config(text, c), c, store=EndpointStore())


@pytest.mark.parametrize(
    "name",
    [
        "picker.admission",
        "picker.admission.flow",
        "picker.admission.flowconfig",
        "picker.admission.queue",
        "picker.admission.saturation",
        "picker.admission.shedding",
        "picker.telemetry.flow",
        "picker.scheduling.tokens",
        "picker.scheduling.units",
    ],
)
def test_all_names_exist_once(name: str) -> None:
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(set(exported)) == len(exported)
    for attr in exported:
        assert hasattr(module, attr), f"{name}.__all__ lists missing {attr}"
