"""The lab's scenarios: traffic that bypasses the routers, independent replicas, restarts, slow engines."""

from __future__ import annotations

from collections import Counter

import pytest

from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, Scenario, poisson_schedule, run_lab
from picker.bench.lab_eval import EVAL_WORKLOADS
from picker.bench.policies import Pick, RoundRobin
from picker.bench.report import summarize
from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest
from picker.scheduling.framework import PluginContext
from picker.sim.config import preset

ENGINE = preset("h100-8b", num_gpu_blocks=256)


def short_requests(n: int, rate: float, seed: int = 0) -> list[tuple[float, wl.WorkItem]]:
    return poisson_schedule(wl.fixed_lengths(prompt_len=64, output_len=16, seed=seed), rate, n, seed)


def shared_prefix(n: int, rate: float, seed: int = 0) -> list[tuple[float, wl.WorkItem]]:
    workload = wl.shared_prefix(
        num_groups=8, prompts_per_group=8, system_prompt_len=1024, question_len=32, output_len=16, seed=seed
    )
    return poisson_schedule(workload, rate, n, seed)


def test_the_plain_scenario_is_the_lab_as_it_was() -> None:
    arrivals = short_requests(60, 20.0)
    a = run_lab(LabConfig(ENGINE, engines=4), "lc", arrivals)
    b = run_lab(LabConfig(ENGINE, engines=4, scenario=Scenario(replicas=1)), "lc", arrivals)
    assert [r.ttft_s for r in a.result.records] == [r.ttft_s for r in b.result.records]
    assert b.external is None


def test_external_traffic_reaches_the_engines_without_a_router() -> None:
    arrivals = short_requests(400, 40.0)
    run = run_lab(LabConfig(ENGINE, engines=4, scenario=Scenario(external_share=0.3)), "rr", arrivals)
    assert run.external is not None
    routed, bypass = len(run.result.records), len(run.external.records)
    assert routed + bypass == 400
    assert 0.22 < bypass / 400 < 0.38
    assert all(r.ok for r in run.external.records)
    assert sum(e.requests for e in run.engines) == routed  # the engines' "routed" counts only the routers'
    assert len(Counter(r.backend for r in run.external.records)) == 4  # uniform: every engine gets some


def test_skewed_external_traffic_all_lands_on_one_engine() -> None:
    scenario = Scenario(external_share=0.5, external_target=2)
    run = run_lab(LabConfig(ENGINE, engines=4, scenario=scenario), "rr", short_requests(100, 20.0))
    assert run.external is not None
    assert {r.backend for r in run.external.records} == {"sim-2"}


def test_replicas_keep_separate_ledgers_and_share_the_requests() -> None:
    ledgers: list[PluginContext] = []

    class Recorder(RoundRobin):
        def __init__(self, ctx: PluginContext) -> None:
            super().__init__(ctx)
            ledgers.append(ctx)

        def pick(self, req: InferenceRequest, candidates: tuple[Endpoint, ...]) -> Pick:  # type: ignore[override]
            return super().pick(req, candidates)

    run = run_lab(LabConfig(ENGINE, engines=4, scenario=Scenario(replicas=3)), Recorder, short_requests(90, 30.0))
    assert len(ledgers) == 3
    assert len({id(c.inflight) for c in ledgers}) == 3
    assert summarize(run.result).ok == 90
    # Three round-robin routers, each starting at the first engine: the spread is no longer perfectly even.
    assert Counter(r.backend for r in run.result.records) != Counter({f"sim-{i}": 90 // 4 for i in range(4)})


def test_a_restart_starts_every_router_afresh_and_loses_no_request() -> None:
    made: list[PluginContext] = []

    def factory(ctx: PluginContext) -> RoundRobin:
        made.append(ctx)
        return RoundRobin(ctx)

    arrivals = short_requests(200, 40.0)
    scenario = Scenario(replicas=2, restart_at_s=arrivals[100][0])
    run = run_lab(LabConfig(ENGINE, engines=4, scenario=scenario), factory, arrivals)
    assert len(made) == 4  # two routers, twice
    assert summarize(run.result).ok == 200
    for ctx in made:  # every lease taken was given back, before or after the restart
        assert all(ctx.inflight.requests(f"10.0.0.{i}:8000") == 0 for i in range(1, 5))


def test_a_slow_engine_takes_longer_for_the_same_work() -> None:
    arrivals = short_requests(80, 10.0)
    run = run_lab(LabConfig(ENGINE, engines=2, scenario=Scenario(slowdowns=(2.5,))), "rr", arrivals)
    names = ("sim-0", "sim-1")
    ttft = {n: [r.ttft_s for r in run.result.records if r.backend == n and r.ttft_s] for n in names}
    slow, fast = (sorted(ttft[n])[len(ttft[n]) // 2] for n in names)
    # Its steps take 2.5x as long; a new request also waits longer for the step in progress to end.
    assert 2.3 < slow / fast < 3.5


def test_pickers_default_moves_off_an_engine_that_outside_traffic_overloads() -> None:
    # Half of the traffic goes straight to sim-0. Policies blind to it (picker-v1 counts picker's own ledger only,
    # least connections its own connections) keep sending it their share; the default, which reads what the
    # servers report, sends it much less.
    policy = "picker"
    arrivals = shared_prefix(600, 60.0)
    config = LabConfig(ENGINE, engines=4, scenario=Scenario(external_share=0.5, external_target=0))
    shares, p90 = {}, {}
    for name in ("picker-v1", "lc", policy):
        run = run_lab(config, name, arrivals)
        shares[name] = Counter(r.backend for r in run.result.records)["sim-0"] / len(run.result.records)
        p90[name] = summarize(run.result).ttft_s.p90
    assert shares[policy] < 0.5 * min(shares["picker-v1"], shares["lc"]), shares
    assert p90[policy] < 0.8 * p90["lc"], p90


@pytest.mark.parametrize(("slowdown", "rate"), [(15.0, 20.0), (100.0, 20.0), (100.0, 100.0)])
def test_pickers_default_keeps_off_an_engine_that_stays_much_slower_without_flooding_it_later(
    slowdown: float, rate: float
) -> None:
    # Short prompts on 8 engines, sim-0 15x or 100x slower throughout. Once its first tokens show it (or go
    # missing), the default sends it next to nothing, and keeps doing so when its last answer grows old (least
    # connections sends a 100x server 8-16 requests at 20 req/s, 33 at 100 req/s).
    short_long = EVAL_WORKLOADS["short-long"]  # the lab's engines and workload
    arrivals = poisson_schedule(short_long.make(0).make(), rate, 1500, 0)
    scenario = Scenario(slowdowns=(slowdown,))
    run = run_lab(LabConfig(short_long.engine, engines=8, scenario=scenario), "picker", arrivals)
    to_slow = [r.start_s for r in run.result.records if r.backend == "sim-0"]
    assert len(run.result.records) == 1500
    assert len(to_slow) < 0.02 * 1500, len(to_slow)  # an even share would be 187
    per_5s = Counter(int(t // 5) for t in to_slow)
    assert max(per_5s.values(), default=0) <= 15, sorted(per_5s.items())


def test_pickers_default_takes_a_recovered_server_back_without_flooding_it() -> None:
    # Short and long prompts at 20 req/s on 8 engines; sim-0 15x slower for the first 70 s, then as fast as the
    # rest. Its cache has the least content: a policy that sends new prompts to the emptiest cache floods it once
    # it is fast again (191 of the ~200 requests of one 10 s window, a p90 TTFT of 80 ms against least
    # connections' 59 in the 30 s after the recovery).
    short_long = EVAL_WORKLOADS["short-long"]
    arrivals = poisson_schedule(short_long.make(0).make(), 20.0, 2400, 0)
    scenario = Scenario(slowdowns=(15.0,), recover_at_s=70.0)
    p90 = {}
    for policy in ("lc", "picker"):
        run = run_lab(LabConfig(short_long.engine, engines=8, scenario=scenario), policy, arrivals)
        after = sorted(r.ttft_s for r in run.result.records if 80.0 <= r.start_s < 110.0 and r.ttft_s is not None)
        p90[policy] = after[int(0.9 * len(after))]
        if policy == "picker":
            to_slow = Counter(int(r.start_s // 10) for r in run.result.records if r.backend == "sim-0")
            assert to_slow[8] + to_slow[9] + to_slow[10] > 30, to_slow  # it does take work again
    assert p90["picker"] < 1.1 * p90["lc"], p90
