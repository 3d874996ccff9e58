"""utilization-detector and concurrency-detector: saturation (admission's signal) and their filter behaviour."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from picker.endpoints.inflight import InflightTracker
from picker.plugins import CycleState, PluginContext
from picker.scheduling.framework import Filter
from picker.scheduling.plugins import saturation
from tests.conftest import FakeClock, endpoint, request
from tests.scheduling.helpers import ids

NOW = 1000.0


def _utilization(**params: object) -> saturation.UtilizationDetector:
    clock = FakeClock(NOW)
    d = saturation.UTILIZATION_SPEC.create(
        "util", saturation.UtilizationParams.model_validate(params), PluginContext(clock, InflightTracker())
    )
    assert isinstance(d, saturation.UtilizationDetector)
    return d


# Table from the reference's detector tests, thresholds queue 5 / kv 0.9 / staleness 100 ms.
@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([], 1.0),  # fail closed
        ([(2, 0.5, 0.0)], 0.5 / 0.9),
        ([(1, 0.1, 0.2)], 1.0),  # stale
        ([(10, 0.1, 0.0)], 2.0),
        ([(1, 0.95, 0.0)], 0.95 / 0.9),
        ([(1, 0.1, 0.0), (0, 0.2, 0.0)], (0.2 + 0.2 / 0.9) / 2),
        ([(1, 0.1, 0.0), (0, 0.2, 0.3)], 0.6),
        ([(1, 0.1, 0.0), (15, 0.2, 0.0)], 1.6),
        ([(5, 0.1, 0.0)], 1.0),
        ([(1, 0.1, 0.101)], 1.0),  # just over the staleness threshold
    ],
)
def test_utilization_saturation(pods: list[tuple[int, float, float]], expected: float) -> None:
    d = _utilization(queueDepthThreshold=5, kvCacheUtilThreshold=0.9, metricsStalenessThreshold="100ms")
    eps = [endpoint(i + 1, waiting=q, kv=kv, updated_at=NOW - age) for i, (q, kv, age) in enumerate(pods)]
    assert d.saturation(eps) == pytest.approx(expected, abs=1e-4)


def test_never_scraped_is_saturated() -> None:
    assert _utilization().saturation([endpoint(1, updated_at=0.0)]) == 1.0


@pytest.mark.parametrize(
    ("pods", "kept"),
    [
        ([(1, 0.1, 0.0), (4, 0.7, 0.0)], [1, 2]),
        ([(5, 0.8, 0.0)], [1]),  # at the threshold, under the 20 % burst
        ([(5, 0.9, 0.0)], [1]),
        ([(7, 0.1, 0.0), (1, 0.1, 0.0)], [2]),
        ([(1, 0.97, 0.0), (1, 0.5, 0.0)], [2]),
        ([(1, 0.1, 0.2), (1, 0.1, 0.0)], [2]),  # the stale one goes
        ([(1, 0.1, 0.2), (1, 0.1, 0.2)], [1, 2]),  # all stale: fail open
        ([(10, 0.1, 0.0), (1, 0.99, 0.0)], [1, 2]),  # all saturated: fail open
    ],
)
def test_utilization_filter_with_headroom(pods: list[tuple[int, float, float]], kept: list[int]) -> None:
    d = _utilization(queueDepthThreshold=5, kvCacheUtilThreshold=0.8, metricsStalenessThreshold=0.1, headroom=0.2)
    assert isinstance(d, Filter)
    eps = [endpoint(i + 1, waiting=q, kv=kv, updated_at=NOW - age) for i, (q, kv, age) in enumerate(pods)]
    assert ids(d.filter(request(), eps, CycleState())) == kept


def test_utilization_filter_defaults_keep_queue_below_5_and_kv_below_08() -> None:
    d = _utilization()
    eps = [endpoint(1, waiting=4, kv=0.79, updated_at=NOW), endpoint(2, waiting=5, updated_at=NOW)]
    eps.append(endpoint(3, kv=0.8, updated_at=NOW))
    assert ids(d.filter(request(), eps, CycleState())) == [1]


@pytest.mark.parametrize(
    "bad",
    [
        {"queueDepthThreshold": 0},
        {"queueDepthThreshold": "x"},
        {"kvCacheUtilThreshold": 1.5},
        {"kvCacheUtilThreshold": 0.0},
        {"metricsStalenessThreshold": "0s"},
        {"metricsStalenessThreshold": "soon"},
        {"headroom": -0.5},
    ],
)
def test_utilization_rejects_bad_parameters(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        saturation.UtilizationParams.model_validate(bad)


def test_staleness_accepts_go_durations_and_seconds() -> None:
    assert saturation.UtilizationParams().metrics_staleness_threshold == 0.2
    assert (
        saturation.UtilizationParams.model_validate({"metricsStalenessThreshold": "1m30s"}).metrics_staleness_threshold
        == 90.0
    )
    assert (
        saturation.UtilizationParams.model_validate({"metricsStalenessThreshold": 0.5}).metrics_staleness_threshold
        == 0.5
    )


def _concurrency(inflight: InflightTracker, **params: object) -> saturation.ConcurrencyDetector:
    d = saturation.CONCURRENCY_SPEC.create(
        "conc", saturation.ConcurrencyParams.model_validate(params), PluginContext(FakeClock(), inflight)
    )
    assert isinstance(d, saturation.ConcurrencyDetector)
    return d


@pytest.mark.parametrize(
    ("loads", "expected"),
    [({}, 1.0), ({1: 0}, 0.0), ({1: 5}, 0.5), ({1: 10}, 1.0), ({1: 10, 2: 0}, 0.5), ({1: 15, 2: 15}, 1.5)],
)
def test_concurrency_saturation_in_requests(loads: dict[int, int], expected: float) -> None:
    inflight = InflightTracker()
    for i, n in loads.items():
        for _ in range(n):
            inflight.acquire(endpoint(i).key, 1, 0.0)
    d = _concurrency(inflight, maxConcurrency=10)
    assert d.saturation([endpoint(i) for i in loads]) == pytest.approx(expected)


def test_concurrency_in_tokens_and_its_filter() -> None:
    inflight = InflightTracker()
    inflight.acquire(endpoint(1).key, 110, 0.0)
    d = _concurrency(inflight, concurrencyMode="tokens", maxTokenConcurrency=100, headroom=0.2)
    eps = [endpoint(1), endpoint(2)]
    assert d.saturation(eps) == pytest.approx(0.55)
    assert ids(d.filter(request(), eps, CycleState())) == [1, 2]  # 110 < 120
    inflight.acquire(endpoint(1).key, 10, 0.0)
    assert ids(d.filter(request(), eps, CycleState())) == [2]
    inflight.acquire(endpoint(2).key, 200, 0.0)
    assert ids(d.filter(request(), eps, CycleState())) == []  # no fail-open here


@pytest.mark.parametrize("bad", [{"maxConcurrency": 0}, {"maxTokenConcurrency": 0}, {"concurrencyMode": "magic"}])
def test_concurrency_rejects_bad_parameters(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        saturation.ConcurrencyParams.model_validate(bad)
