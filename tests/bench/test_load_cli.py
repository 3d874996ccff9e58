"""``picker load`` and ``picker tokens`` end to end against simulators in a background thread."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from picker.cli import main
from picker.sim.config import preset
from picker.sim.harness import ThreadedServers


@pytest.fixture(scope="module")
def sims() -> Iterator[ThreadedServers]:
    with ThreadedServers(preset("fast", lora_adapters=("x",)), count=2) as servers:
        yield servers


def test_load_writes_json_and_plot(sims: ThreadedServers, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(
        [
            "load", "--url", sims.urls[0], "--workload", "shared-prefix", "--groups", "2", "--system-len", "64",
            "--question-len", "8", "--output-len", "4", "--concurrency", "2", "--requests", "12",
            "--json", str(out), "--plot", str(png), "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    doc = orjson.loads(out.read_bytes())
    assert doc["summary"]["ok"] == 12
    assert len(doc["records"]) == 12
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "Little's law" in capsys.readouterr().out


def test_load_sweep_and_fixed(sims: ThreadedServers, tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    rc = main(
        [
            "load", "--url", sims.urls[0], "--workload", "short-long", "--fixed", "3", "--rate", "20,40",
            "--requests", "6", "--api", "chat", "--lora", "x", "--json", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    stages = orjson.loads(out.read_bytes())["stages"]
    assert [s["spec"]["rate"] for s in stages] == [20.0, 40.0]
    assert all(r["output_tokens"] == 3 and r["model"] == "x" for s in stages for r in s["records"])


def test_load_several_urls_at_once(sims: ThreadedServers, tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    url = ",".join(sims.urls)
    rc = main(
        [
            "load", "--url", url, "--workload", "fixed", "--prompt-len", "16", "--fixed", "4",
            "--concurrency", "3", "--requests", "9", "--json", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert rc == 0
    summary = orjson.loads(out.read_bytes())["summary"]
    assert summary["ok"] == 18
    assert summary["target_concurrency"] == 6
    assert summary["backends"] == {s.name: 9 for s in sims.servers}


def test_load_bad_flags(sims: ThreadedServers) -> None:
    assert main(["load", "--url", sims.urls[0], "--header", "nocolon", "--no-progress"]) == 2
    assert main(["load", "--url", "http://127.0.0.1:1", "--requests", "1", "--no-progress"]) == 1


def test_tokens(sims: ThreadedServers, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokens", "--url", sims.urls[0], "The", "cat", "sat."]) == 0
    out = capsys.readouterr().out
    assert out.startswith("4 tokens\n258 2733 2517 46\nThe| cat| sat|.\n")
    assert "round trip: ok" in out
    assert main(["tokens", "--local", "--json", "héllo"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["round_trip"] is True
    assert doc["count"] == len("héllo".encode())
