"""The lab's peer exchange between replicas, and ``picker bench lab-ha``."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from picker.bench.lab import LabConfig, LabRun, Scenario, poisson_schedule, run_lab
from picker.bench.lab_eval import EVAL_WORKLOADS
from picker.bench.report import summarize
from picker.cli import main


def run(scenario: Scenario, n: int = 500, rate: float = 160.0, policy: str = "picker") -> LabRun:
    w = EVAL_WORKLOADS["shared-prefix"]
    arrivals = poisson_schedule(w.make(0), rate, n, 0)
    return run_lab(LabConfig(w.engine, engines=8, seed=0, scenario=scenario), policy, arrivals, rate=rate)


@pytest.mark.parametrize("policy", ["picker", "picker-v1"])
def test_the_exchange_restores_prefix_placement_across_replicas(policy: str) -> None:
    one = summarize(run(Scenario(), policy=policy).result)
    independent = summarize(run(Scenario(replicas=4), policy=policy).result)
    exchanged = run(Scenario(replicas=4, exchange=True, exchange_delay_s=0.001, exchange_flush_s=0.002), policy=policy)
    shared = summarize(exchanged.result)
    assert independent.cached_share < one.cached_share - 0.03  # the gap the exchange is for
    assert shared.cached_share > independent.cached_share + 0.03
    assert shared.ttft_s.p90 < 0.5 * independent.ttft_s.p90
    assert exchanged.exchange_batches > 0
    assert 0 < exchanged.exchange_bytes / 500 < 20_000  # bytes per routed request, all links together


def test_an_exchange_that_loses_every_batch_is_independent_replicas() -> None:
    independent = run(Scenario(replicas=2), n=300)
    lost = run(Scenario(replicas=2, exchange=True, exchange_loss=1.0), n=300)
    assert lost.exchange_bytes > 0
    pairs = zip(independent.result.records, lost.result.records, strict=True)
    assert all((a.backend, a.ttft_s) == (b.backend, b.ttft_s) for a, b in pairs)


def test_one_replica_exchanges_nothing() -> None:
    assert run(Scenario(exchange=True), n=100).exchange_bytes == 0


def test_bad_exchange_settings() -> None:
    with pytest.raises(ValueError, match="exchange"):
        Scenario(exchange=True, exchange_loss=1.5)
    with pytest.raises(ValueError, match="exchange"):
        Scenario(exchange=True, exchange_flush_s=0.0)


def test_cli_prints_the_acceptance_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ha.json"
    argv = ["bench", "lab-ha", "--quick", "--requests", "300", "--replicas", "2", "--jobs", "1", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "| shared-prefix | 160 | 2 | exchange 1 ms |" in text
    rows = orjson.loads(out.read_bytes())
    assert [(r["replicas"], r["mode"]) for r in rows] == [(1, "one"), (2, "independent"), (2, "exchange 1 ms")]
    assert rows[0]["p90_vs_one"] == 1.0
    assert rows[2]["exchange_bytes"] > 0
    assert main(["bench", "lab-ha", "--replicas", "1"]) == 2


def test_config_runs_every_replica_with_that_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], v1_config: Path
) -> None:
    # Four independent replicas on shared prefixes, each running picker-v1's configuration: its choices are not
    # the default's, so the table's rows differ.
    argv = ["bench", "lab-ha", "--quick", "--requests", "400", "--replicas", "4", "--jobs", "1"]
    rows: dict[str, list[dict[str, object]]] = {}
    for name, extra in (("default", []), ("v1", ["--config", str(v1_config)])):
        out = tmp_path / f"{name}.json"
        assert main([*argv, *extra, "--json", str(out)]) == 0
        rows[name] = orjson.loads(out.read_bytes())
    assert f"picker with {v1_config}" in capsys.readouterr().out
    measured = [[(r["p90_ttft_s"], r["hit_share"]) for r in rows[name]] for name in ("default", "v1")]
    assert measured[0] != measured[1]
    assert main([*argv, "--config", str(tmp_path / "absent.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    v1_config.write_text("plugins: [")
    assert main([*argv, "--config", str(v1_config)]) == 2
