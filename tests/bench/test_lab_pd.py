"""P/D in the policy lab: fleets with roles, llm-d's sidecar played in virtual time, and the P/D benchmark."""

from __future__ import annotations

import argparse

import pytest

from picker.bench import lab_pd, lab_pd_cli
from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, LabRun, run_lab
from picker.bench.lab_pd import Fleet, pd_config
from picker.bench.policies import SchedulerPolicy
from picker.scheduling import Scheduler, load_config
from picker.scheduling.framework import PluginContext
from picker.sim.config import EngineConfig, StepTiming
from tests.scheduling.test_config import LLMD_PD

# Exact binary fractions: times compare exactly.
TIMING = StepTiming(overhead_s=2**-7, prefill_s_per_token=2**-13, decode_s_per_seq=2**-10, prefill_overhead_s=2**-5)
PER_TOKEN = 2**-12
ENGINE = EngineConfig(timing=TIMING, num_gpu_blocks=2048, kv_transfer_s_per_token=PER_TOKEN)


def test_fleets() -> None:
    assert Fleet.parse("8").roles == ("",) * 8
    assert not Fleet.parse("8").disaggregated
    assert Fleet.parse("2p6d").roles == ("prefill",) * 2 + ("decode",) * 6
    assert Fleet.parse("1p2d1b").roles == ("prefill", "decode", "decode", "both")
    for bad in ("", "0", "3p", "x", "2p2x"):
        with pytest.raises(ValueError, match="fleet"):
            Fleet.parse(bad)


def test_the_sample_config_is_llm_d_s_as_shipped() -> None:
    assert pd_config("prefix:16") == LLMD_PD
    assert "always-disagg-pd-decider" in pd_config("always")
    assert "minPromptTokens: 1024" in pd_config("length:1024")
    for bad in ("sometimes", "prefix", "prefix:x", "always:3"):
        with pytest.raises(ValueError, match="decider"):
            pd_config(bad)


def test_roles_must_fit_the_fleet() -> None:
    with pytest.raises(ValueError, match="roles"):
        LabConfig(ENGINE, engines=2, roles=("prefill",))
    with pytest.raises(ValueError, match="roles"):
        LabConfig(ENGINE, engines=1, roles=("chef",))


def _policy(decider: str):  # type: ignore[no-untyped-def]
    text = pd_config(decider)

    def factory(ctx: PluginContext) -> SchedulerPolicy:
        return SchedulerPolicy("pd", Scheduler(load_config(text, ctx), ctx))

    return factory


def _run(fleet: str, decider: str, arrivals: list[tuple[float, wl.WorkItem]]) -> LabRun:
    f = Fleet.parse(fleet)
    config = LabConfig(ENGINE, engines=f.engines, roles=f.roles if f.disaggregated else ())
    return run_lab(config, _policy(decider), arrivals)


def _item(prompt_tokens: int, out: int, seed: int = 0) -> wl.WorkItem:
    return wl.with_fixed(wl.fixed_lengths(prompt_len=prompt_tokens, output_len=out, seed=seed), out).take(1)[0]


def test_one_request_is_prefilled_on_the_prefill_engine_and_decoded_after_the_transfer() -> None:
    item = _item(500, 5)
    run = _run("1p1d", "always", [(0.0, item)])
    [rec] = run.result.records
    assert rec.ok
    assert rec.backend == "sim-1"  # the decode engine answers
    assert run.disaggregated == 1
    n = rec.prompt_tokens
    assert n is not None
    prefill = TIMING.overhead_s + TIMING.prefill_overhead_s + n * TIMING.prefill_s_per_token
    decode_step = TIMING.overhead_s + TIMING.decode_s_per_seq
    assert rec.ttft_s == pytest.approx(prefill + n * PER_TOKEN + decode_step)
    assert rec.e2e_s == pytest.approx(prefill + n * PER_TOKEN + 5 * decode_step)
    prefill_engine, decode_engine = run.engines
    assert prefill_engine.steps == 1  # the prompt and its one token
    assert decode_engine.steps == 5  # no prefill step: one pulled-prompt step, then decode


def test_aggregated_fleet_with_the_same_config_serves_decode_only() -> None:
    item = _item(500, 5)
    run = _run("2", "always", [(0.0, item)])
    [rec] = run.result.records
    assert rec.ok
    assert run.disaggregated == 0
    assert rec.ttft_s == pytest.approx(TIMING.overhead_s + TIMING.prefill_overhead_s + 500 * TIMING.prefill_s_per_token)


def test_the_prefix_decider_keeps_a_cached_prompt_on_its_decode_engine() -> None:
    item = _item(2000, 4)
    run = _run("1p1d", "prefix:512", [(0.0, item), (10.0, item)])
    first, second = run.result.records
    assert run.disaggregated == 1  # only the first: the decode engine holds the whole prompt the second time
    assert first.ok
    assert second.ok
    assert second.ttft_s is not None
    assert first.ttft_s is not None
    assert second.ttft_s < first.ttft_s
    assert second.cached_tokens == second.prompt_tokens - 1 - (second.prompt_tokens - 1) % ENGINE.block_size


def test_every_lease_is_given_back() -> None:
    workload = wl.with_fixed(wl.fixed_lengths(prompt_len=800, output_len=16), 16)
    arrivals = [(i * 0.01, item) for i, item in enumerate(workload.take(60))]
    leases: list[PluginContext] = []

    def factory(ctx: PluginContext) -> SchedulerPolicy:
        leases.append(ctx)
        return SchedulerPolicy("pd", Scheduler(load_config(pd_config("always"), ctx), ctx))

    f = Fleet.parse("2p2d")
    run = run_lab(LabConfig(ENGINE, engines=4, roles=f.roles), factory, arrivals)
    assert all(r.ok for r in run.result.records)
    assert run.disaggregated == 60
    [ctx] = leases
    for i in range(4):
        load = ctx.inflight.load(f"10.0.0.{i + 1}:8000")
        assert (load.requests, load.tokens) == (0, 0)


def test_quick_benchmark_run(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    lab_pd_cli.configure(parser)
    args = parser.parse_args(["--workloads", "long-prompt", "--fleets", "4,1p3d", "--requests", "40", "--rates", "4"])
    assert lab_pd_cli.run(args) == 0
    out = capsys.readouterr().out
    assert "long-prompt (3072-token prompts, 128-token answers) at 4 req/s" in out
    rows = lab_pd_cli.run_matrix(["long-prompt"], [Fleet.parse("4"), Fleet.parse("1p3d")], ["always"], requests=40)
    rates = len(lab_pd_cli.WORKLOADS["long-prompt"].rates)
    assert [(r.fleet, r.decider) for r in rows] == [("4", "-"), ("1p3d", "always")] * rates
    assert all(r.failed == 0 for r in rows)
    assert all(r.disaggregated == (1.0 if r.fleet == "1p3d" else 0.0) for r in rows)
    # Decoding never waits behind a 3072-token prefill in the disaggregated fleet.
    for agg, pd in zip(rows[::2], rows[1::2], strict=True):
        assert pd.max_itl_s.p90 < agg.max_itl_s.p90
    table = lab_pd_cli.markdown(rows)
    assert table.count("| 4 | 1p3d | always | 100% |") == 1
    assert table.startswith("**long-prompt**")


def test_bad_benchmark_flags(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    lab_pd_cli.configure(parser)
    for argv in (["--workloads", "nope"], ["--fleets", "0"], ["--deciders", "maybe"], ["--rates", "-1"]):
        assert lab_pd_cli.run(parser.parse_args(argv)) == 2
    assert "picker bench lab-pd" in capsys.readouterr().err
    assert lab_pd.ROLES[0] == ""
