"""Admission without flow control: sheddable requests are dropped while the pool is saturated."""

from __future__ import annotations

import pytest

from picker import errors
from picker.admission import SHED_MESSAGE, ShedAdmitter, detector_for, shed_error
from picker.scheduling.config import load_config
from picker.scheduling.plugins import saturation
from tests.admission.helpers import Gate, req
from tests.conftest import endpoint
from tests.scheduling.helpers import HEAD, ctx

EPS = (endpoint(1), endpoint(2))


@pytest.mark.parametrize(
    ("priority", "level", "shed"),
    [(-1, 1.0, True), (-1, 2.5, True), (-1, 0.99, False), (0, 5.0, False), (2, 5.0, False), (-5, 0.0, False)],
)
async def test_only_sheddable_requests_are_shed_and_only_when_saturated(
    priority: int, level: float, shed: bool
) -> None:
    admitter = ShedAdmitter(Gate(level))
    if shed:
        with pytest.raises(errors.ResourceExhausted) as info:
            await admitter.admit(req(priority=priority), EPS)
        assert info.value.status == 429
        assert (
            info.value.wire_text == "inference error: ResourceExhausted - system saturated, sheddable request dropped"
        )
    else:
        await admitter.admit(req(priority=priority), EPS)


async def test_non_sheddable_requests_never_measure_saturation() -> None:
    gate = Gate(10.0)
    await ShedAdmitter(gate).admit(req(priority=0), EPS)
    assert gate.calls == 0


async def test_shed_status_503() -> None:
    with pytest.raises(errors.ServiceUnavailable, match=SHED_MESSAGE):
        await ShedAdmitter(Gate(1.0), shed_status=503).admit(req(priority=-1), EPS)
    assert shed_error(429).status == 429
    assert shed_error(503).status == 503


async def test_default_detector_is_the_reference_utilization_detector() -> None:
    c = ctx()
    detector = detector_for(load_config(None, c), c)
    assert isinstance(detector, saturation.UtilizationDetector)
    assert detector.settings == saturation.UtilizationParams()
    now = c.clock()
    fresh_full = [endpoint(1, waiting=5, updated_at=now), endpoint(2, kv=0.8, updated_at=now)]
    with pytest.raises(errors.ResourceExhausted):
        await ShedAdmitter(detector).admit(req(priority=-1), fresh_full)
    await ShedAdmitter(detector).admit(req(priority=-1), [endpoint(1, waiting=4, updated_at=now)])
    with pytest.raises(errors.ResourceExhausted):  # stale metrics count as saturated
        await ShedAdmitter(detector).admit(req(priority=-1), [endpoint(1, updated_at=now - 1.0)])


def test_configured_detector_is_used() -> None:
    c = ctx()
    text = HEAD + (
        "plugins:\n- type: queue-scorer\n- name: conc\n  type: concurrency-detector\n"
        "  parameters: {maxConcurrency: 2}\nsaturationDetector: {pluginRef: conc}\n"
    )
    detector = detector_for(load_config(text, c), c)
    assert isinstance(detector, saturation.ConcurrencyDetector)
    c.inflight.acquire(endpoint(1).key, 1, 0.0)
    assert detector.saturation([endpoint(1)]) == 0.5
