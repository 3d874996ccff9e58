"""``picker bench lab``: flags, the table per rate, and JSON that is the same for a seed (in another process)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from picker.cli import main

SMALL = [
    "bench", "lab", "--engines", "4", "--requests", "60", "--groups", "4", "--system-len", "256",
    "--prompts-per-group", "4", "--output-len", "8", "--num-gpu-blocks", "256",
]  # fmt: skip


def test_lab_prints_a_table_per_rate_and_writes_json_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, png = tmp_path / "lab.json", tmp_path / "lab.png"
    argv = [*SMALL, "--rates", "5,20", "--policies", "rr,reference,lmetric", "--json", str(out), "--png", str(png)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "shared-prefix at 5 req/s (4 engines)" in text
    assert "shared-prefix at 20 req/s (4 engines)" in text
    assert "wall" in text
    doc = orjson.loads(out.read_bytes())
    assert doc["lab"]["engine_config"]["num_gpu_blocks"] == 256
    runs = doc["runs"]
    assert [(r["policy"], r["rate"]) for r in runs] == [
        (p, rate) for rate in (5.0, 20.0) for p in ("rr", "reference", "lmetric")
    ]
    for r in runs:
        assert r["summary"]["requests"] == r["summary"]["ok"] == 60
        assert sum(r["shares"].values()) == pytest.approx(1.0)
        assert [e["name"] for e in r["engines"]] == ["sim-0", "sim-1", "sim-2", "sim-3"]
        assert "records" not in r
    rr = runs[0]
    assert rr["shares"] == {f"sim-{i}": 0.25 for i in range(4)}
    assert rr["imbalance"] == 1.0
    assert png.stat().st_size > 10_000


def test_the_json_is_the_same_for_a_seed_in_another_process(tmp_path: Path) -> None:
    def run(seed: int, hash_seed: str) -> bytes:
        out = tmp_path / f"lab-{seed}-{hash_seed}.json"
        argv = [*SMALL, "--rate", "10", "--policies", "p2c,picker,cache-aware", "--seed", str(seed)]
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        subprocess.run(
            [sys.executable, "-m", "picker.cli", *argv, "--records", "--json", str(out)],
            env=env, check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        return out.read_bytes()

    first = run(3, "1")
    assert run(3, "2") == first
    assert run(4, "1") != first


def test_config_files_and_bad_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "queue-only.yaml"
    cfg.write_text(
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: queue-scorer\n"
    )
    assert main([*SMALL, "--rate", "5", "--policies", "rr", "--config", str(cfg)]) == 0
    assert f"config:{cfg}" in capsys.readouterr().out
    assert main([*SMALL, "--rate", "5", "--policies", "fastest"]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err
    assert main([*SMALL, "--rates", "5,x"]) == 2
    assert main([*SMALL, "--rate", "5", "--policies", "rr", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


def test_slo_headers_reach_the_scheduler_and_attainment_is_counted(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "bench", "lab", "--workload", "seed-mix", "--preset", "gpu-bounded", "--engines", "4", "--requests", "80",
        "--rate", "16", "--policies", "rr,picker", "--slo", "short:100",
    ]  # fmt: skip
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "SLO attainment" in line]
    assert len(lines) == 2  # one per policy
    for line in lines:
        met, total = (int(x) for x in line.split(":")[1].split("(")[0].split(" of "))
        assert 0 < total < 80
        assert 0 <= met <= total


def test_slo_attainment_without_headers_measures_the_schedule_the_headers_would_change(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [
        "bench", "lab", "--workload", "seed-mix", "--preset", "gpu-bounded", "--engines", "4", "--requests", "300",
        "--rate", "16", "--policies", "picker", "--slo", "short:60",
    ]  # fmt: skip
    attained: dict[str, str] = {}
    for mode, extra in (("headers", []), ("without", ["--slo-without-headers"])):
        assert main([*argv, *extra]) == 0
        (line,) = [line for line in capsys.readouterr().out.splitlines() if "SLO attainment" in line]
        attained[mode] = line
    assert attained["headers"] != attained["without"]  # headroom scoring placed the short requests differently
    assert main([*SMALL, "--rate", "5", "--policies", "rr", "--slo-without-headers"]) == 2
    assert "needs --slo" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["short", "short:x", ":100", "short:0", "short:-5:10"])
def test_a_bad_slo_is_a_usage_error(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SMALL, "--rate", "5", "--policies", "rr", "--slo", spec]) == 2
    assert "--slo" in capsys.readouterr().err


def test_slo_attainment_counts_ttft_and_tpot() -> None:
    from picker.bench.lab_cli import slo_attainment
    from picker.bench.load import RequestRecord

    def rec(tag: str, ttft: float, e2e: float, out: int, status: int = 200) -> RequestRecord:
        return RequestRecord(0, tag, "m", 0.0, e2e_s=e2e, ttft_s=ttft, output_tokens=out, status=status)

    records = [
        rec("short", 0.05, 0.2, 4),  # met
        rec("short", 0.5, 0.7, 4),  # TTFT missed
        rec("long", 0.05, 10.25, 401),  # TPOT 25.5 ms: missed
        rec("long", 0.05, 8.05, 401),  # TPOT 20 ms: met
        rec("short", 0.05, 0.2, 4, status=500),  # failed
        rec("other", 9.0, 9.0, 1),  # no SLO: not counted
    ]
    assert slo_attainment(records, {"short": (100.0, None), "long": (None, 25.0)}) == (2, 5)
