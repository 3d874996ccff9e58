"""latency-scorer: the server model's choice request by request, SLO headroom, configuration."""

from __future__ import annotations

import pytest

from picker import errors
from picker.control.director import acquire_lease
from picker.endpoints.model import Endpoint
from picker.plugins import CycleState
from picker.request.slo import Slo, slo_of
from picker.scheduling.config import load_config
from picker.scheduling.plugins import latency
from picker.scheduling.plugins.prefix import PrefixMatch
from picker.scheduling.scheduler import Scheduler
from picker.scheduling.servermodel import Estimate
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx

CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: latency-scorer
  parameters:
    prefixFrom: ""
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
"""


def _pool(waiting: tuple[int, ...], running: int = 4, at: float = 1000.0) -> list[Endpoint]:
    # own_requests=0: the reports hold none of picker's requests (the poller notes picker's count at each scrape)
    return [endpoint(i + 1, waiting=w, running=running, own_requests=0, updated_at=at) for i, w in enumerate(waiting)]


def _scraped(scheduler: Scheduler | latency.LatencyScorer, waiting: tuple[int, ...]) -> list[Endpoint]:
    """The pool as three scrapes reported it, a request of picker's finishing on each server between two (a queue
    seen at the same batch while slots free and fill again is a slot limit)."""
    scorer = scheduler if isinstance(scheduler, latency.LatencyScorer) else _latency_scorer(scheduler)
    for at in (999.8, 999.9):
        pool = _pool(waiting, at=at)
        scorer.score(request(), pool, CycleState())
        for e in pool:
            scorer.model.observe_done(e.key)
    return _pool(waiting)


def _latency_scorer(scheduler: Scheduler) -> latency.LatencyScorer:
    found = [p for p in scheduler.config.plugins.values() if isinstance(p, latency.LatencyScorer)]
    assert len(found) == 1
    return found[0]


def test_a_burst_fills_the_idle_server_until_its_queue_reaches_the_others() -> None:
    c = ctx()
    scheduler = Scheduler(load_config(CONFIG, c), c)
    pool = _scraped(scheduler, (5, 0, 9))  # full servers (4 running) with 5, 0 and 9 waiting
    chosen: list[str] = []
    for i in range(12):
        req = request(request_id=f"r{i}")  # answers of the model's mean length, as the others' are taken to be
        result = scheduler.schedule(req, pool)
        key = result.targets[0].key
        acquire_lease(c.inflight, key, req, result, c.clock())
        chosen.append(key)
    idle, five, nine = pool[1].key, pool[0].key, pool[2].key
    assert chosen[:5] == [idle] * 5  # picker's own queue there reaches the others' five
    assert nine not in chosen[:10]  # a queue of 9 never looks cheaper than a shorter one
    assert five in chosen[5:]


def test_when_the_reports_change_the_next_request_follows() -> None:
    c = ctx()
    scheduler = Scheduler(load_config(CONFIG, c), c)
    before = _scraped(scheduler, (5, 0, 9))
    assert scheduler.schedule(request(), before).targets[0].key == before[1].key
    after = _pool((9, 5, 0), at=1000.1)
    assert scheduler.schedule(request(), after).targets[0].key == after[2].key


def test_slo_headers_in_both_spellings() -> None:
    assert slo_of(request()) is None
    slo = slo_of(request(headers={"x-llm-d-slo-ttft-ms": "250", "x-slo-tpot-ms": "40"}))
    assert slo is not None
    assert slo.ttft_s == 0.25
    assert slo.tpot_s == 0.04
    assert slo_of(request(headers={"x-slo-ttft-ms": "soon", "x-llm-d-slo-tpot-ms": "-3"})) is None


def _scorer(**params: object) -> latency.LatencyScorer:
    scorer = latency.create("l", latency.Params.model_validate({"prefixFrom": "", **params}), ctx())
    assert isinstance(scorer, latency.LatencyScorer)
    return scorer


def test_with_slos_the_most_headroom_wins_and_least_is_one_option_away() -> None:
    found = [Estimate(t, 0.02, t, 0.0, 1.0) for t in (0.05, 0.2, 0.4)]
    most = _scorer()._headroom_scores(found, Slo(0.3, None))
    assert most[0] == 1.0  # meets 300 ms with the most to spare
    assert 0.5 <= most[1] < 1.0
    assert most[2] == 0.0  # misses it
    least = _scorer(headroomSelectionStrategy="least")._headroom_scores(found, Slo(0.3, None))
    assert least[1] == 1.0  # llm-d's default: the least to spare
    assert 0.5 <= least[0] < 1.0


def test_when_no_server_meets_the_slo_the_smallest_shortfall_wins() -> None:
    found = [Estimate(t, 0.02, t, 0.0, 1.0) for t in (0.5, 0.4, 0.9)]
    scores = _scorer()._headroom_scores(found, Slo(0.3, 0.05))
    assert max(scores) == scores[1] < 0.5
    assert scores[2] < scores[0]


def test_requests_without_slos_prefer_the_lowest_predicted_end_to_end_time() -> None:
    scorer = _scorer()
    pool = _scraped(scorer, (3, 0, 1))
    scores = scorer.score(request(max_tokens=16, fixed_output=True), pool, CycleState())
    assert scores[pool[1]] == 1.0
    assert scores[pool[1]] > scores[pool[2]] > scores[pool[0]]


def test_prefix_from_must_name_a_declared_prefix_index() -> None:
    bad = CONFIG.replace('prefixFrom: ""', "prefixFrom: nowhere")
    with pytest.raises(errors.ConfigError, match="nowhere"):
        load_config(bad, ctx())
    not_prefix = CONFIG.replace('prefixFrom: ""', "prefixFrom: queue-scorer").replace(
        "- type: latency-scorer", "- type: queue-scorer\n- type: latency-scorer"
    )
    with pytest.raises(errors.ConfigError, match="no prefix index"):
        load_config(not_prefix, ctx())


class _HeldBy:
    """A prefix index that says ``holder`` caches the whole prompt and nobody else any of it."""

    def __init__(self, holder: Endpoint, tokens: float) -> None:
        self.holder, self.tokens = holder, tokens

    def match(self, req: object, endpoints: object, cycle: CycleState) -> PrefixMatch:
        return PrefixMatch({self.holder.key: 32}, 32, 64, 32 * 64, self.tokens)


def test_under_load_a_cached_prompt_stays_where_it_is_cached_despite_a_backlog() -> None:
    c = ctx()
    scorer = latency.LatencyScorer("l", latency.Params.model_validate({"prefixFrom": ""}), c)
    holder, idle = endpoint(1, own_requests=0), endpoint(2, own_requests=0)
    scorer._prefix = _HeldBy(holder, 2048.0)
    lease = c.inflight.acquire(holder.key, 5000, c.clock(), prefill_tokens=5000)  # 0.5 s of prefill ahead there
    req = request(prompt_tokens=2048, max_tokens=8, fixed_output=True)
    quiet = scorer.score(req, [holder, idle], CycleState())
    assert quiet[idle] > quiet[holder]  # few arrivals: computing the prompt on the idle server is quicker
    c.inflight.release(lease)
    for i in range(200):  # picker routes 100 requests a second, half to each
        c.clock.advance(0.01)  # type: ignore[attr-defined]
        scorer.model.observe_arrival(c.clock(), (holder, idle)[i % 2].key)
    c.inflight.acquire(holder.key, 5000, c.clock(), prefill_tokens=5000)  # the same backlog, routed just now
    busy = scorer.score(req, [holder, idle], CycleState())
    assert busy[holder] > busy[idle]  # the prefill would delay every request arriving at the idle server behind it
