"""KV events in the policy lab: routers' indexes follow the engines through the real wire path, and precise
affinity holds where per-replica approximate views cannot."""

from __future__ import annotations

from pathlib import Path

from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, Scenario, _Lab, poisson_schedule, run_lab
from picker.bench.policies import SchedulerPolicy, make_policy
from picker.scheduling.framework import PluginContext
from picker.scheduling.plugins.precise_prefix import PrecisePrefixCacheScorer
from picker.sim.config import preset

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "kv-events"
ENGINE = preset("h100-8b", num_gpu_blocks=512)


def arrivals(n: int, rate: float, groups: int, seed: int = 0) -> list[tuple[float, wl.WorkItem]]:
    workload = wl.shared_prefix(
        num_groups=groups, prompts_per_group=4, system_prompt_len=1024, question_len=32, output_len=16, seed=seed
    )
    return poisson_schedule(workload, rate, n, seed)


def hit_share(records: list) -> float:  # type: ignore[type-arg]
    ok = [r for r in records if r.status == 200]
    return sum(r.cached_tokens for r in ok) / sum(r.prompt_tokens for r in ok)


def test_the_index_built_from_delayed_events_matches_the_engines() -> None:
    indexes: list[PrecisePrefixCacheScorer] = []

    def factory(ctx: PluginContext) -> SchedulerPolicy:
        policy = make_policy(f"config:{EXAMPLES / 'precise.yaml'}", ctx)
        assert isinstance(policy, SchedulerPolicy)
        indexes.extend(p for p in policy.scheduler.config.plugins.values() if isinstance(p, PrecisePrefixCacheScorer))
        return policy

    config = LabConfig(ENGINE, engines=4, kv_event_delay_s=0.01)
    lab = _Lab(config, factory, sorted(arrivals(300, 8.0, groups=12), key=lambda a: a[0]))
    lab.run()
    assert all(r.status == 200 for r in lab.records)
    assert lab.kv_bus is not None
    assert lab.kv_bus.published > 0
    (scorer,) = indexes
    index = scorer.index
    index.expire(float("inf"))  # speculative entries aside
    assert index.stats.unknown_parent == 0
    assert index.stats.removed_blocks > 0  # the caches churned
    # Every batch has been delivered: the index holds exactly what each engine's cache holds.
    for endpoint, engine in zip(lab.endpoints, lab.engines, strict=True):
        assert index.endpoint_blocks(endpoint.key) == engine.pool.num_cached


def test_precise_beats_approximate_with_several_replicas_and_ties_with_one() -> None:
    work = arrivals(600, 10.0, groups=16)
    results = {}
    for replicas in (1, 4):
        config = LabConfig(ENGINE, engines=4, scenario=Scenario(replicas=replicas))
        for name in ("precise", "approximate", "none"):
            run = run_lab(config, f"config:{EXAMPLES / f'{name}.yaml'}", work, rate=10.0)
            results[name, replicas] = hit_share(run.result.records)
    # one router: both know where prefixes are (within a few points); four routers: each approximate view sees a
    # quarter of the traffic, the event index sees every server
    assert abs(results["precise", 1] - results["approximate", 1]) < 0.05
    assert results["precise", 4] > results["approximate", 4] + 0.15
    assert results["precise", 4] > results["precise", 1] - 0.05
    assert min(results["precise", 1], results["approximate", 1]) > results["none", 1] + 0.2
