"""The lab where servers run out of slots: the seed's mix, closed loops, mixed pools, and the mix's own numbers."""

from __future__ import annotations

from collections import Counter

import pytest

from picker.bench import lab_report
from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, poisson_schedule, run_lab
from picker.sim.config import preset

FAST16 = preset("fast", max_num_seqs=16)


def test_seed_mix_is_the_seeds_lengths_and_shares() -> None:
    items = wl.seed_mix(seed=3).take(2000)
    kinds = Counter(i.tag for i in items)
    assert kinds["long"] / len(items) == pytest.approx(0.3, abs=0.03)
    assert kinds["short"] + kinds["long"] == len(items)
    for item in items[:50]:
        n_prompt = len(item.prompt.split())
        if item.tag == "short":
            assert (n_prompt, item.max_tokens) == (wl.SEED_SHORT_PROMPT_TOKENS, 4)
        else:
            assert (n_prompt, item.max_tokens) == (wl.SEED_LONG_PROMPT_TOKENS, 512)
        assert item.min_tokens == item.max_tokens
        assert item.ignore_eos
    assert len({i.prompt for i in items}) == len(items)  # no prefix shared by chance


def test_closed_loop_keeps_exactly_n_requests_in_flight() -> None:
    items = wl.seed_mix(seed=0, long_output=32).take(60)
    arrivals = [(0.0, item) for item in items]
    run = run_lab(LabConfig(FAST16, engines=2, streams=3), "lc", arrivals)
    records = sorted(run.result.records, key=lambda r: r.start_s)
    assert all(r.ok for r in records)
    assert len(records) == 60
    assert run.result.spec.concurrency == 3
    assert run.result.spec.rate is None
    assert [r.start_s for r in records[:3]] == [0.0, 0.0, 0.0]
    ends = sorted(r.end_s for r in records)
    # Every later request starts the moment an earlier one ends: the k-th start after the first three is the
    # k-th end.
    for k, rec in enumerate(records[3:]):
        assert rec.start_s == pytest.approx(ends[k])
    for rec in records:  # never more than 3 at once
        assert sum(r.start_s <= rec.start_s < r.end_s for r in records) <= 3


def test_a_mixed_pool_runs_each_engine_with_its_own_configuration() -> None:
    small = preset("fast", max_num_seqs=1)
    arrivals = [(0.0, item) for item in wl.fixed_lengths(prompt_len=8, output_len=8).take(8)]
    run = run_lab(LabConfig(small, engines=2, pool=(small, FAST16), streams=8), "rr", arrivals)
    ttft: dict[str, list[float]] = {"sim-0": [], "sim-1": []}
    for r in run.result.records:
        assert r.backend is not None
        assert r.ttft_s is not None
        ttft[r.backend].append(r.ttft_s)
    # Four requests at once each: one slot serves them one after another, sixteen serve them together.
    assert max(ttft["sim-0"]) > 3 * max(ttft["sim-1"])
    with pytest.raises(ValueError, match="pool"):
        LabConfig(small, engines=3, pool=(small, FAST16))


def test_mix_stats_are_the_short_ttfts_and_long_tpots() -> None:
    arrivals = poisson_schedule(wl.seed_mix(seed=1, long_output=64), 20.0, 80, 1)
    row = lab_report.make_row("lc", run_lab(LabConfig(FAST16, engines=2), "lc", arrivals).result)
    assert row.mix is not None
    ok = row.result.records
    short = sorted(r.ttft_s for r in ok if r.tag == "short" and r.ttft_s is not None)
    assert row.mix.short_ttft_s.count == len(short) == sum(r.tag == "short" for r in ok)
    assert row.mix.short_ttft_s.max == short[-1]
    assert row.mix.long_tpot_s.count == sum(r.tag == "long" for r in ok)
    assert row.mix.e2e_s.count == len(ok)
    assert set(lab_report.row_json(row)["mix"]) >= {"short_ttft_p90_s", "long_tpot_p90_s", "e2e_p90_s"}
    plain = run_lab(LabConfig(FAST16, engines=2), "lc", poisson_schedule(wl.fixed_lengths(), 20.0, 10, 0))
    assert lab_report.make_row("lc", plain.result).mix is None
