"""The policy lab in virtual time: what the scheduler is fed, determinism, and small runs whose outcome is known."""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Sequence
from pathlib import Path

import orjson
import pytest

from picker.bench import lab_report
from picker.bench import workloads as wl
from picker.bench.lab import EPOCH_S, LabConfig, poisson_schedule, run_lab, scraped_metrics
from picker.bench.policies import Pick
from picker.bench.report import summarize
from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest
from picker.scheduling.framework import PluginContext, ResponseInfo
from picker.scrape import engines
from picker.sim.config import preset
from picker.sim.engine import Engine, SimRequest
from picker.sim.metrics import SimMetrics
from picker.sim.tokenizer import default_tokenizer

SHARED = preset("h100-8b", num_gpu_blocks=256)  # 4k tokens: ~4 of the 8 system prompts of 1024 tokens


def shared_prefix(n: int, rate: float, seed: int = 0) -> list[tuple[float, wl.WorkItem]]:
    workload = wl.shared_prefix(
        num_groups=8, prompts_per_group=8, system_prompt_len=1024, question_len=32, output_len=16, seed=seed
    )
    return poisson_schedule(workload, rate, n, seed)


def test_scraped_metrics_are_what_the_vllm_scrape_reads_from_the_simulator_page() -> None:
    engine = Engine(preset("fast", max_num_seqs=2, lora_adapters=("a", "b"), max_loras=1))
    tok = default_tokenizer()
    for i, lora in enumerate(("a", "a", None, "b")):
        engine.submit(SimRequest(f"r{i}", tok.encode(" the cat sat" * 20), max_tokens=50, lora=lora), 0.0)
    end = engine.begin_step(0.0)
    assert end is not None
    engine.finish_step()
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.running_loras, stats.waiting_loras) == (2, 2, ("a",), ("b",))
    page = SimMetrics(engine).render()
    assert scraped_metrics(stats, 42.0) == engines.extract("vllm", page, 42.0)


def test_arrivals_follow_the_load_clients_schedule() -> None:
    items = wl.fixed_lengths(prompt_len=8, output_len=2).take(5)
    schedule = poisson_schedule(items, 10.0, 5, seed=3)
    assert [it for _, it in schedule] == items
    times = [t for t, _ in schedule]
    assert times[0] == 0.0
    assert times == sorted(times)
    assert poisson_schedule(items, 10.0, 5, seed=3) == schedule
    assert poisson_schedule(items, 10.0, 5, seed=4) != schedule


def test_round_robin_spreads_evenly_and_records_every_request() -> None:
    run = run_lab(LabConfig(SHARED, engines=8), "rr", shared_prefix(80, rate=20.0), workload="shared-prefix")
    s = summarize(run.result)
    assert (s.requests, s.ok) == (80, 80)
    assert s.backends == {f"sim-{i}": 10 for i in range(8)}
    assert [e.requests for e in run.engines] == [10] * 8
    rec = run.result.records[0]
    assert rec.start_s == 0.0
    assert rec.ttft_s is not None
    assert 0 < rec.ttft_s < rec.e2e_s
    assert rec.prompt_tokens is not None
    assert rec.prompt_tokens > 1024
    assert rec.output_tokens == rec.chunks >= 1
    # An idle h100-8b engine answers the first ~1060-token prompt in one prefill step.
    assert rec.ttft_s == pytest.approx(SHARED.timing.step_s(
        prefill_tokens=rec.prompt_tokens, decode_seqs=0, context_tokens=rec.prompt_tokens, lora=False
    ))  # fmt: skip
    assert s.littles_ratio == pytest.approx(1.0, abs=0.15)  # the in-flight samples match the records


def test_least_connections_beats_round_robin_on_a_skewed_mix() -> None:
    """Every 4th request streams 512 tokens: round robin sends all of them to one engine of four."""
    short = wl.WorkItem(messages=(("user", " the cat" * 4),), max_tokens=4, min_tokens=4, ignore_eos=True)
    long = wl.WorkItem(messages=(("user", " the dog" * 4),), max_tokens=512, min_tokens=512, ignore_eos=True)
    schedule = poisson_schedule([long if i % 4 == 0 else short for i in range(200)], 8.0, 200, seed=1)
    config = LabConfig(preset("h100-8b", max_num_seqs=8), engines=4)
    rr = summarize(run_lab(config, "rr", schedule).result)
    lc = summarize(run_lab(config, "lc", schedule).result)
    assert rr.ok == lc.ok == 200
    assert lc.ttft_s.p90 < rr.ttft_s.p90 / 10  # round robin queues behind its 8-sequence limit
    assert lc.e2e_s.p90 < rr.e2e_s.p90


def test_reference_config_caches_more_than_round_robin_on_shared_prefix() -> None:
    config = LabConfig(SHARED, engines=4)
    schedule = shared_prefix(300, rate=10.0)
    rr = summarize(run_lab(config, "rr", schedule).result)
    ref = summarize(run_lab(config, "reference", schedule).result)
    assert ref.cached_share > rr.cached_share + 0.2
    assert ref.ttft_s.p50 < rr.ttft_s.p50


def test_a_run_is_deterministic_for_a_seed() -> None:
    def doc(seed: int) -> bytes:
        out = []
        for policy in ("reference", "p2c", "cache-aware", "lmetric"):
            run = run_lab(LabConfig(SHARED, engines=4, seed=seed), policy, shared_prefix(120, 30.0, seed))
            row = lab_report.make_row(policy, run.result, [f"sim-{i}" for i in range(4)])
            out.append({**lab_report.row_json(row, records=True), **run.to_json()})
        return orjson.dumps(out)

    assert doc(0) == doc(0)
    assert doc(0) != doc(1)


def test_user_plugins_in_a_config_file_steer_the_lab(tmp_path: Path) -> None:
    path = tmp_path / "favourite.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            apiVersion: inference.networking.x-k8s.io/v1alpha1
            kind: EndpointPickerConfig
            plugins:
            - type: queue-scorer
            - name: favourite
              type: tests.plugins.samples:FavouriteScorer
              parameters: {key: "10.0.0.3:8000"}
            schedulingProfiles:
            - name: default
              plugins:
              - pluginRef: queue-scorer
              - pluginRef: favourite
                weight: 5
            """
        )
    )
    run = run_lab(LabConfig(SHARED, engines=4), f"config:{path}", shared_prefix(20, 5.0))
    assert run.policy == f"config:{path}"
    assert summarize(run.result).backends == {"sim-2": 20}


def test_engine_rejections_are_failed_records_and_release_the_lease() -> None:
    too_long = wl.WorkItem(messages=(("user", " the" * 5000),), max_tokens=4000)  # over max_model_len 8192
    fine = wl.WorkItem(messages=(("user", " the cat"),), max_tokens=4)
    run = run_lab(LabConfig(SHARED, engines=2), "lc", [(0.0, too_long), (0.5, fine), (0.6, fine)])
    recs = run.result.records
    assert (recs[0].status, recs[0].ok) == (400, False)
    assert "maximum context length" in (recs[0].error or "")
    # The failed request's lease was released: least-connections sees both engines idle again.
    assert [r.ok for r in recs[1:]] == [True, True]
    assert summarize(run.result).errors == {"HTTP 400": 1}


@dataclasses.dataclass
class Recorder:
    """Round robin that records what each pick saw: the time, and per endpoint (waiting, updated_at, in flight)."""

    ctx: PluginContext
    name: str = "recorder"
    seen: list[tuple[float, list[tuple[int, float, int]]]] = dataclasses.field(default_factory=list)

    def pick(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Pick:
        view = [(e.metrics.waiting, e.metrics.updated_at, self.ctx.inflight.requests(e.key)) for e in candidates]
        self.seen.append((self.ctx.clock(), view))
        return Pick(candidates[len(self.seen) % len(candidates)])

    def routed(self, req: InferenceRequest, pick: Pick) -> None: ...

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None: ...

    def completed(self, req: InferenceRequest, info: ResponseInfo) -> None: ...

    def endpoints_changed(self, keys: frozenset[str]) -> None: ...


def test_policies_see_scraped_metrics_as_stale_as_the_interval_and_exact_inflight() -> None:
    recorders: list[Recorder] = []

    def factory(ctx: PluginContext) -> Recorder:
        recorders.append(Recorder(ctx))
        return recorders[-1]

    item = wl.WorkItem(messages=(("user", " the cat" * 50),), max_tokens=64, min_tokens=64, ignore_eos=True)
    burst = [(i * 0.01, item) for i in range(6)] + [(0.25, item)]  # one engine sequence each: a queue builds
    run_lab(LabConfig(preset("h100-8b", max_num_seqs=1), engines=2, scrape_interval_s=0.1), factory, burst)
    seen = recorders[0].seen
    for now, view in seen[:6]:  # within the first interval: the scrape at the start, queues still empty
        assert now < EPOCH_S + 0.1
        assert [(w, at) for w, at, _ in view] == [(0, EPOCH_S), (0, EPOCH_S)]
    assert [sum(n for _, _, n in view) for _, view in seen[:6]] == [0, 1, 2, 3, 4, 5]  # in flight: exact, at once
    now, view = seen[6]
    assert now == EPOCH_S + 0.25
    assert [at for _, at, _ in view] == [pytest.approx(EPOCH_S + 0.2)] * 2
    assert [w for w, _, _ in view] == [2, 2]  # by the 0.2 s scrape each engine runs one and queues two
