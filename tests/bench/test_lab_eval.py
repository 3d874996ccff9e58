"""``picker bench lab-eval --quick``: every policy on every standard workload, the ratios, JSON and PNG."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from picker.bench import lab_eval, lab_report
from picker.bench.lab_eval import BASELINE_POLICIES, EVAL_WORKLOADS, PICKER
from picker.cli import main
from picker.scheduling.config import DEFAULT_CONFIG_TEXT


def test_quick_eval_covers_every_policy_and_workload(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "eval.json", tmp_path / "eval.png"
    argv = ["bench", "lab-eval", "--quick", "--scenarios", "plain,external", "--workloads", "standard"]
    argv += ["--json", str(out), "--png", str(png)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "vs the best other policy" in text
    doc = orjson.loads(out.read_bytes())
    standard = set(lab_eval.WORKLOAD_GROUPS["standard"])
    assert set(doc["workloads"]) == standard == {"shared-prefix", "multi-turn", "short-long", "multi-lora"}
    assert set(doc["eval"]["scenarios"]) == {"plain", "external"}
    for name, w in doc["workloads"].items():
        got = {(r["scenario"], r["policy"], r["rate"]) for r in w["runs"]}
        want = {
            (sc, p, rate) for sc in ("plain", "external") for p in (*BASELINE_POLICIES, PICKER)
            for rate in EVAL_WORKLOADS[name].quick_rates
        }  # fmt: skip
        assert got == want
        for r in w["runs"]:
            if r["scenario"] == "plain":
                assert r["ok"] + r["failed"] == doc["eval"]["requests"]
            else:  # ~30 % of the requests bypassed the routers: the report counts the routed ones
                assert 0.6 * doc["eval"]["requests"] < r["ok"] + r["failed"] < 0.8 * doc["eval"]["requests"]
            assert r["ttft_s"]["p90"] > 0
    assert {(r["scenario"], r["workload"]) for r in doc["ratios"]} == {
        (sc, w) for sc in ("plain", "external") for w in standard
    }
    assert png.stat().st_size > 10_000

    # On shared prefixes picker's default keeps each group where it is cached; round robin thrashes every cache.
    shared = next(r for r in doc["ratios"] if r["workload"] == "shared-prefix" and r["scenario"] == "plain")
    print(f"shared-prefix at {shared['rate']:g} req/s: round robin p90 / picker p90 = {shared['vs_rr']:.1f}x")
    assert shared["picker_p90_s"] < shared["rr_p90_s"]
    assert shared["vs_rr"] == pytest.approx(shared["rr_p90_s"] / shared["picker_p90_s"])


def test_seed_mix_points_run_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--workloads seed-mix``: the bounded-concurrency points only, open and closed loop, with the mix's numbers."""
    out, md = tmp_path / "mix.json", tmp_path / "mix.md"
    argv = ["bench", "lab-eval", "--quick", "--workloads", "seed-mix", "--requests", "40", "--jobs", "1"]
    argv += ["--policies", "lc,envoy-least-request,picker", "--json", str(out), "--markdown", str(md)]
    assert main(argv) == 0
    capsys.readouterr()
    doc = orjson.loads(out.read_bytes())
    group = lab_eval.WORKLOAD_GROUPS["seed-mix"]
    assert set(doc["workloads"]) == set(group)
    assert len(group) == 5
    for name in group:
        w = EVAL_WORKLOADS[name]
        runs = doc["workloads"][name]["runs"]
        assert doc["workloads"][name]["closed_loop"] == w.closed
        # Each workload runs only under its own scenarios (the seed-mix ones: plain, and some a slow server).
        assert {r["scenario"] for r in runs} == {sc for sc in w.scenarios or () if sc in doc["eval"]["scenarios"]}
        for r in runs:
            assert r["failed"] == 0
            assert r["ok"] == 40
            assert r["mix"]["short"] + r["mix"]["long"] == 40
            assert r["mix"]["short_ttft_p90_s"] > 0
            assert r["mix"]["long_tpot_p90_s"] > 0
    text = md.read_text()
    assert "4 streams" in text
    assert "short-request TTFT p90 / long-answer TPOT p90 / e2e p90" in text


def test_ratios_pick_the_best_other_policy_per_rate() -> None:
    rows = lab_eval.evaluate(
        [EVAL_WORKLOADS["shared-prefix"]], ["rr", "reference", PICKER], requests=60, quick=True, log=lambda _: None
    )[0][("plain", "shared-prefix")]
    [ratio] = lab_eval.ratios("shared-prefix", rows)
    p90 = {r.label: r.summary.ttft_s.p90 for r in rows}
    best = min(("rr", "reference"), key=p90.__getitem__)
    assert ratio.best_baseline == best
    assert ratio.best_baseline_p90_s == p90[best]
    assert ratio.vs_best == pytest.approx(p90[best] / p90[PICKER])
    assert ratio.lowest == (p90[PICKER] <= p90[best])


def test_unknown_workload_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "lab-eval", "--workloads", "nope"]) == 2
    assert "unknown workload" in capsys.readouterr().err


def _p90s(rows: list[lab_report.Row]) -> dict[str, float]:
    return {r.label: r.summary.ttft_s.p90 for r in rows}


def test_the_run_cache_reuses_runs_until_an_input_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "candidate.yaml"
    config.write_text(DEFAULT_CONFIG_TEXT)
    policies = ["rr", f"config:{config}"]
    workloads = [EVAL_WORKLOADS["short-long"]]
    ran: list[str] = []
    real_run = lab_eval._run_point

    def counting(workload: str, scenario: str, rate: float, policy: str, requests: int, seed: int):  # type: ignore[no-untyped-def]
        ran.append(policy)
        return real_run(workload, scenario, rate, policy, requests, seed)

    monkeypatch.setattr(lab_eval, "_run_point", counting)
    cache = lab_eval.RunCache(tmp_path / "runs")

    def evaluate(cache: lab_eval.RunCache) -> dict[str, float]:
        got = lab_eval.evaluate(workloads, policies, requests=60, quick=True, log=lambda _: None, cache=cache)
        return _p90s(got[0][("plain", "short-long")])

    first = evaluate(cache)
    assert sorted(ran) == sorted(policies)
    ran.clear()
    assert evaluate(cache) == first  # every run from the cache, the same numbers
    assert ran == []

    config.write_text(
        DEFAULT_CONFIG_TEXT.replace(
            "- type: latency-scorer", "- type: latency-scorer\n  parameters:\n    headroomTTFTWeight: 0.5"
        )
    )  # the candidate changed
    evaluate(cache)
    assert ran == [f"config:{config}"]
    ran.clear()

    other_source = tmp_path / "source"  # picker's code changed: nothing kept applies
    other_source.mkdir()
    (other_source / "x.py").write_text("changed = True\n")
    evaluate(lab_eval.RunCache(tmp_path / "runs", source=other_source))
    assert sorted(ran) == sorted(policies)


def test_the_run_cache_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ValueError, match="others cannot write"):
        lab_eval.RunCache(shared)
    own = tmp_path / "own"
    lab_eval.RunCache(own)
    assert own.stat().st_mode & 0o777 == 0o700


def test_a_torn_cache_entry_is_run_again(tmp_path: Path) -> None:
    cache = lab_eval.RunCache(tmp_path / "runs")
    point = ("short-long", "plain", 100.0, "rr")
    cache.put(point, 60, 0, lab_eval._run_point(*point, 60, 0)[0])
    [entry] = list((tmp_path / "runs").iterdir())
    entry.write_bytes(entry.read_bytes()[:20])
    assert cache.get(point, 60, 0) is None


def test_cache_flag_reports_the_reused_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "lab-eval", "--quick", "--workloads", "short-long", "--scenarios", "plain", "--policies", "rr"]
    argv += ["--requests", "60", "--jobs", "1", "--cache", str(tmp_path / "runs")]
    assert main(argv) == 0
    assert "0 of 1 runs from the cache" in capsys.readouterr().out
    assert main(argv) == 0
    assert "1 of 1 runs from the cache" in capsys.readouterr().out


def test_several_seeds_compare_the_mean_p90(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, md = tmp_path / "eval.json", tmp_path / "eval.md"
    argv = ["bench", "lab-eval", "--quick", "--workloads", "short-long", "--scenarios", "plain", "--jobs", "1"]
    argv += ["--policies", f"rr,lc,{PICKER}", "--requests", "80", "--seeds", "0,1,2"]
    assert main([*argv, "--json", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    doc = orjson.loads(out.read_bytes())
    assert doc["eval"]["seeds"] == [0, 1, 2]
    runs = doc["workloads"]["short-long"]["runs"]
    [rate] = EVAL_WORKLOADS["short-long"].quick_rates
    p90 = {(r["seed"], r["policy"]): r["ttft_s"]["p90"] for r in runs if r["rate"] == rate}
    assert len(p90) == 9  # every policy at every seed: the seeds are other runs, not the same one thrice
    assert len({p90[(seed, PICKER)] for seed in (0, 1, 2)}) > 1
    mean = {policy: sum(p90[(seed, policy)] for seed in (0, 1, 2)) / 3 for policy in ("rr", "lc", PICKER)}
    [ratio] = doc["ratios"]
    best = min(("rr", "lc"), key=mean.__getitem__)
    assert ratio["best_baseline"] == best
    assert ratio["picker_p90_s"] == pytest.approx(mean[PICKER])
    assert ratio["vs_best"] == pytest.approx(mean[best] / mean[PICKER])
    met = int(ratio["vs_best"] >= 1 / lab_eval.WITHIN)
    assert doc["within"]["mean"] == [met, 1]
    for seed in (0, 1, 2):
        seed_best = min(p90[(seed, "rr")], p90[(seed, "lc")])
        assert doc["within"][str(seed)] == [int(seed_best / p90[(seed, PICKER)] >= 1 / lab_eval.WITHIN), 1]
    assert f"{met} of 1 points on the mean p90" in text
    assert "averaged over seeds 0-2" in md.read_text()
    # Seed by seed, against the best on the mean; three seeds are too few for an interval.
    behind = sum(p90[(seed, PICKER)] > lab_eval.WITHIN * p90[(seed, best)] for seed in (0, 1, 2))
    assert (ratio["seeds_behind"], ratio["seeds"], ratio["interval"]) == (behind, 3, None)
    assert f"{behind}/3" in md.read_text()


def _ratio(pairs: list[tuple[float, float]]) -> lab_eval.Ratio:
    """A point's ratio on the mean of ``pairs`` (picker's p90, the best other's), with its spread over them."""
    mine, best = (sum(x) / len(pairs) for x in zip(*pairs, strict=True))
    ratio = lab_eval.Ratio("w", 10.0, mine, "rr", best, best, best / mine, best / mine, lowest=mine <= best)
    return lab_eval._over_seeds(ratio, pairs)


def test_the_spread_over_seeds_tells_a_real_miss_from_the_draw() -> None:
    # Behind by 5-10 % at every seed: outside, whatever the draw.
    steady = _ratio([(1.05 + 0.01 * i, 1.0) for i in range(6)])
    assert steady.seeds_behind == 6
    assert steady.interval is not None
    assert steady.interval[1] < 1 / lab_eval.WITHIN
    assert steady.interval[0] <= steady.vs_best <= steady.interval[1]
    assert lab_eval.verdict(steady) == "no"
    # Behind on the mean (by 4 %), yet ahead at four of the six seeds: another draw could put it within.
    mixed = _ratio([(1.3, 1.0), (0.95, 1.0), (1.2, 1.0), (0.95, 1.0), (0.9, 1.0), (0.9, 1.0)])
    assert not lab_eval.within(mixed)
    assert mixed.seeds_behind == 2
    assert mixed.interval is not None
    assert mixed.interval[0] < 1 / lab_eval.WITHIN <= mixed.interval[1]
    assert lab_eval.verdict(mixed) == "undecided"
    # The same runs print the same interval; fewer than five seeds print none, and a miss stays a miss.
    assert _ratio([(1.05 + 0.01 * i, 1.0) for i in range(6)]).interval == steady.interval
    few = _ratio([(1.1, 1.0), (0.9, 1.0), (1.2, 1.0)])
    assert few.interval is None
    assert lab_eval.verdict(few) == "no"
    assert lab_eval.verdict(_ratio([(0.99, 1.0)] * 6)) == "yes"
    close = _ratio([(1.01, 1.0)] * 6)  # 1 % behind at every seed: within, and behind at none
    assert lab_eval.verdict(close) == "within 2 %"
    assert close.seeds_behind == 0


def test_rates_and_seed_ranges_pick_the_points(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 20 req/s is on the ladders of multi-turn and multi-LoRA in both scenarios, on shared-prefix's in the plain
    # one only, and on none of short-long's: those points run, at both seeds of the range, and nothing else.
    out, md = tmp_path / "eval.json", tmp_path / "eval.md"
    argv = ["bench", "lab-eval", "--workloads", "shared-prefix,multi-turn,multi-lora,short-long"]
    argv += ["--scenarios", "plain,external"]
    argv += ["--rates", "20", "--policies", f"rr,{PICKER}", "--requests", "60", "--seeds", "3-4", "--jobs", "1"]
    assert main([*argv, "--json", str(out), "--markdown", str(md)]) == 0
    doc = orjson.loads(out.read_bytes())
    assert doc["eval"]["seeds"] == [3, 4]
    ran = {(w, r["scenario"], r["rate"], r["seed"]) for w, v in doc["workloads"].items() for r in v["runs"]}
    want = {("multi-turn", sc, 20.0, seed) for sc in ("plain", "external") for seed in (3, 4)}
    want |= {("multi-lora", sc, 20.0, seed) for sc in ("plain", "external") for seed in (3, 4)}
    want |= {("shared-prefix", "plain", 20.0, seed) for seed in (3, 4)}
    assert ran == want
    assert doc["workloads"]["short-long"]["rates"] == {"plain": [], "external": []}
    assert {(r["scenario"], r["workload"], r["rate"]) for r in doc["ratios"]} == {
        (sc, w, 20.0) for sc in ("plain", "external") for w in ("multi-turn", "multi-lora")
    } | {("plain", "shared-prefix", 20.0)}
    text = md.read_text()
    assert "**multi-turn**" in text
    assert "**short-long**" not in text


def test_rates_no_workload_runs_at_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for rates in ("7", "x", ","):
        assert main(["bench", "lab-eval", "--workloads", "multi-turn", "--rates", rates]) == 2
        assert "--rates" in capsys.readouterr().err


def test_bad_seeds_are_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for seeds in ("0,x", "1,1", ",", "0-2,1", "3-1"):
        assert main(["bench", "lab-eval", "--quick", "--seeds", seeds]) == 2
        assert "--seeds" in capsys.readouterr().err


def test_seed_lists_print_as_ranges() -> None:
    assert lab_eval.seed_text([0, 1, 2, 3, 7, 9, 10]) == "0-3, 7, 9-10"
    assert lab_eval.seed_text([4]) == "4"
    assert lab_eval.seed_text([]) == ""
    assert lab_eval.further_seeds([0, 1, 2, 5], 7) == [3, 4, 6]
    assert lab_eval.further_seeds(range(10), 10) == []


def test_a_point_is_unsettled_when_its_interval_reaches_across_the_line_on_either_side() -> None:
    line = 1 / lab_eval.WITHIN
    ahead_by_chance = _ratio([(0.85, 1.0), (1.1, 1.0), (0.9, 1.0), (1.05, 1.0), (0.9, 1.0), (0.95, 1.0)])
    assert ahead_by_chance.lowest
    behind_by_chance = _ratio([(1.3, 1.0), (0.95, 1.0), (1.2, 1.0), (0.95, 1.0), (0.9, 1.0), (0.9, 1.0)])
    assert not lab_eval.within(behind_by_chance)
    for ratio in (ahead_by_chance, behind_by_chance):
        assert ratio.interval is not None
        assert ratio.interval[0] < line <= ratio.interval[1]
        assert lab_eval.straddling(ratio)
    assert not lab_eval.straddling(_ratio([(0.9 + 0.01 * i, 1.0) for i in range(6)]))  # ahead at every draw
    assert not lab_eval.straddling(_ratio([(1.05 + 0.01 * i, 1.0) for i in range(6)]))  # behind at every draw
    assert not lab_eval.straddling(_ratio([(1.3, 1.0), (0.9, 1.0), (1.2, 1.0)]))  # too few seeds for an interval


def test_settling_a_point_equals_running_it_at_every_seed_from_the_start() -> None:
    workloads, policies = [EVAL_WORKLOADS["short-long"]], ["rr", "lc", PICKER]
    quiet = {"requests": 60, "quick": True, "log": lambda _: None}
    base = lab_eval.evaluate(workloads, policies, seeds=range(5), **quiet)  # type: ignore[arg-type]
    [first] = lab_eval.mean_ratios("short-long", [base[s][("plain", "short-long")] for s in range(5)])
    [settled], added = lab_eval.settle([first], base, policies, total=7, requests=60, log=lambda _: None)
    assert list(added) == [5, 6]
    whole = lab_eval.evaluate(workloads, policies, seeds=range(7), **quiet)  # type: ignore[arg-type]
    [want] = lab_eval.mean_ratios("short-long", [whole[s][("plain", "short-long")] for s in range(7)])
    assert settled == want
    assert settled.seeds == 7
    assert settled != first  # two more seeds moved the means


def test_settle_seeds_runs_only_the_unsettled_points_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two points; whichever straddles is decided by the runs, so the test names one: multi-lora's.
    monkeypatch.setattr(lab_eval, "straddling", lambda r: r.workload == "multi-lora")
    out, md = tmp_path / "eval.json", tmp_path / "eval.md"
    argv = ["bench", "lab-eval", "--quick", "--workloads", "short-long,multi-lora", "--scenarios", "plain"]
    argv += ["--policies", f"rr,{PICKER}", "--requests", "60", "--seeds", "0-4", "--settle-seeds", "7", "--jobs", "1"]
    assert main([*argv, "--json", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    doc = orjson.loads(out.read_bytes())
    assert doc["eval"]["settled"] == [{"scenario": "plain", "workload": "multi-lora", "rate": 10.0}]
    seeds = {w: sorted({r["seed"] for r in v["runs"]}) for w, v in doc["workloads"].items()}
    assert seeds == {"short-long": [0, 1, 2, 3, 4], "multi-lora": [0, 1, 2, 3, 4, 5, 6]}
    by = {r["workload"]: r for r in doc["ratios"]}
    assert (by["short-long"]["seeds"], by["multi-lora"]["seeds"]) == (5, 7)
    p90 = {(r["seed"], r["policy"]): r["ttft_s"]["p90"] for r in doc["workloads"]["multi-lora"]["runs"]}
    mean = {p: sum(p90[(s, p)] for s in range(7)) / 7 for p in ("rr", PICKER)}
    assert by["multi-lora"]["vs_best"] == pytest.approx(mean["rr"] / mean[PICKER])
    assert "settling 1 point(s)" in text
    assert "their ratios are over seeds 0-6" in text
    assert "averaged over seeds 0-4, and over seeds 0-6 at the points" in md.read_text()
    assert "(`--settle-seeds 7`; their 'seeds behind' counts out of 7)." in md.read_text()


def test_settle_seeds_with_nothing_unsettled_runs_nothing_more(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lab_eval, "straddling", lambda r: False)
    out = tmp_path / "eval.json"
    argv = ["bench", "lab-eval", "--quick", "--workloads", "short-long", "--scenarios", "plain", "--jobs", "1"]
    argv += ["--policies", f"rr,{PICKER}", "--requests", "60", "--seeds", "0-4", "--settle-seeds", "7"]
    assert main([*argv, "--json", str(out)]) == 0
    assert "nothing to settle" in capsys.readouterr().out
    doc = orjson.loads(out.read_bytes())
    assert doc["eval"]["settled"] == []
    assert sorted({r["seed"] for r in doc["workloads"]["short-long"]["runs"]}) == [0, 1, 2, 3, 4]


def test_settle_seeds_needs_enough_seeds_to_draw_an_interval(capsys: pytest.CaptureFixture[str]) -> None:
    for seeds, total in (("0-2", "10"), ("0-9", "10"), ("0-9", "5")):
        assert main(["bench", "lab-eval", "--quick", "--seeds", seeds, "--settle-seeds", total]) == 2
        assert "--settle-seeds" in capsys.readouterr().err
