"""``picker demo --short`` end to end (simulated servers, picker, the real Envoy): picker ahead of round robin, and
nothing left running afterwards — after success, after a failing child, after Ctrl-C.

Each demo runs in a session of its own, so "nothing left" is checked as "no process in that session"
(``assert_nothing_left``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.e2e.procs import assert_nothing_left, finish_demo

pytestmark = pytest.mark.e2e

DEMO = [sys.executable, "-m", "picker.cli", "demo", "--short"]


def start(args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*DEMO, *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )


def test_short_demo_shows_picker_ahead_of_round_robin_and_cleans_up(tmp_path: Path) -> None:
    proc = start(["--json", "demo.json", "--png", "demo.png"], tmp_path)
    code, out = finish_demo(proc, 90.0)
    assert code == 0, out
    assert_nothing_left(proc.pid)
    doc = orjson.loads((tmp_path / "demo.json").read_bytes())
    rr, picker = doc["phases"]
    assert (rr["label"], picker["label"]) == ("envoy round robin", "envoy + picker")
    for phase in (rr, picker):
        s = phase["summary"]
        assert s["ok"] == s["requests"] > 50
        assert len(phase["shares"]) == 4
    assert rr["imbalance"] == pytest.approx(1.0, abs=0.1)  # Envoy's round robin
    ratios = doc["ratios"]
    print(f"\npicker vs round robin TTFT: mean {ratios['ttft_mean']:.2f}x, p50 {ratios['ttft_p50']:.2f}x, "
          f"p90 {ratios['ttft_p90']:.2f}x lower; cached {picker['summary']['cached_share']:.0%} vs "
          f"{rr['summary']['cached_share']:.0%}")  # fmt: skip
    assert picker["summary"]["ttft_s"]["mean"] < rr["summary"]["ttft_s"]["mean"]
    assert picker["summary"]["cached_share"] > rr["summary"]["cached_share"]
    assert {p["name"] for p in doc["processes"]} == {"sims", "picker", "envoy"}
    assert all(p["returncode"] == 0 for p in doc["processes"])
    assert "envoy + picker" in out
    assert (tmp_path / "demo.png").stat().st_size > 10_000


@pytest.mark.e2e
def test_short_demo_through_ngf_data_path(tmp_path: Path) -> None:
    """``picker demo --gateway ngf``: nginx + njs + the NGF shim in front of the simulated servers."""
    proc = start(["--gateway", "ngf", "--duration", "8", "--json", "demo.json", "--png", "demo.png"], tmp_path)
    code, out = finish_demo(proc, 90.0)
    assert code == 0, out
    assert_nothing_left(proc.pid)
    doc = orjson.loads((tmp_path / "demo.json").read_bytes())
    pool, picker = doc["phases"]
    assert (pool["label"], picker["label"]) == ("nginx pool upstream", "ngf + picker")
    for phase in (pool, picker):
        s = phase["summary"]
        assert s["ok"] == s["requests"] > 30
        assert len(phase["shares"]) == 4
    assert picker["summary"]["cached_share"] > pool["summary"]["cached_share"]
    assert [p["name"] for p in doc["processes"]] == ["sims", "nginx", "sims", "picker", "ngf-shim", "nginx"]
    assert all(p["returncode"] == 0 for p in doc["processes"])
    assert "NGINX Gateway Fabric" in out


def test_a_child_that_fails_makes_the_demo_exit_nonzero_and_stops_the_rest(tmp_path: Path) -> None:
    fake = tmp_path / "envoy"
    fake.write_text("#!/bin/sh\necho 'fake envoy: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    proc = start([], tmp_path, env=dict(os.environ, PICKER_ENVOY_BIN=str(fake)))
    code, out = finish_demo(proc, 60.0)
    assert code == 1, out
    assert "envoy" in out
    assert "fake envoy: cannot start" in out
    assert "started sims" in out  # the servers were up when Envoy failed, and were stopped
    assert_nothing_left(proc.pid)


def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    proc = start([], tmp_path)
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    while b"started envoy" not in seen:  # the first phase's whole stack is up
        line = proc.stdout.readline()
        assert line, seen.decode(errors="replace")  # the demo ended before its first Envoy started
        assert time.monotonic() < deadline, seen.decode(errors="replace")
        seen += line
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    code, out = finish_demo(proc, 30.0)
    assert code == 128 + signal.SIGINT, seen.decode() + out
    assert "SIGINT" in out
    assert_nothing_left(proc.pid)
