"""``picker bench seed-mix`` at a few seconds per phase: the seed's mix through the real Envoy (LEAST_REQUEST,
ROUND_ROBIN, Envoy + picker), every request answered, the table and JSON complete, nothing left running."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from picker.bench import seed_mix
from picker.cli import main

pytestmark = pytest.mark.e2e


def test_seed_mix_bench_runs_every_phase_to_completion(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "seed-mix.json", tmp_path / "seed-mix.png"
    argv = ["bench", "seed-mix", "--preset", "fast", "--duration", "2", "--rate", "5", "--long-output", "16"]
    assert main([*argv, "--json", str(out), "--png", str(png)]) == 0
    text = capsys.readouterr().out
    doc = orjson.loads(out.read_bytes())
    labels = [label for label, _ in seed_mix.PHASES.values()]
    assert [p["label"] for p in doc["phases"]] == labels
    sent = {p["summary"]["requests"] for p in doc["phases"]}
    assert len(sent) == 1  # the same seeded arrivals in every phase
    for p in doc["phases"]:
        s = p["summary"]
        assert s["failed"] == 0
        assert s["ok"] == s["requests"] > 3  # every request completed
        assert p["mix"]["short"] + p["mix"]["long"] == s["ok"]
        assert p["mix"]["short_ttft_p90_s"] > 0
        assert set(p["shares"]) == {"server-1", "server-2", "server-3", "server-4"}
        assert sum(p["shares"].values()) == pytest.approx(1.0)
    # The Markdown table: a header, a rule and one row per phase, each with every column.
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| route | short TTFT p50 | short TTFT p90 | long TPOT p90 | e2e p90 |")
    rows = table[1:]
    assert [r.split(" | ")[0].removeprefix("| ") for r in rows] == labels
    assert all(r.count("|") == table[0].count("|") for r in rows)
    assert all(p["returncode"] == 0 for p in doc["processes"])  # every child stopped cleanly
    assert png.stat().st_size > 10_000
