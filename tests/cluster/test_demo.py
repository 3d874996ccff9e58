"""``picker demo --kube`` at a small size: the control plane, the chart, pods and picker discovering them through the
InferencePool, then the demo's table; everything gone afterwards, also after Ctrl-C.

The demo starts its own control plane (not the fixture's): it is what a user runs. Each run is in a session of its
own, so "nothing left" covers etcd, kube-apiserver and the rest as well as the servers, picker and Envoy.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.e2e.procs import assert_nothing_left, finish_demo

pytestmark = [pytest.mark.timeout(150), pytest.mark.e2e]

DEMO = [sys.executable, "-m", "picker.cli", "demo", "--kube", "--short", "--sims", "2"]


def start(args: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*DEMO, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def test_kube_demo_routes_through_the_pool_picker_found_in_the_api(tmp_path: Path) -> None:
    started = time.monotonic()
    proc = start(["--duration", "5", "--json", "demo.json", "--png", "demo.png"], tmp_path)
    code, out = finish_demo(proc, 120.0)
    print(f"\npicker demo --kube --short --sims 2 --duration 5: {time.monotonic() - started:.1f} s")
    assert code == 0, out
    assert_nothing_left(proc.pid)
    doc = orjson.loads((tmp_path / "demo.json").read_bytes())
    assert not Path(doc["cluster_dir"]).exists()  # the control plane's folder (PKI, etcd data) is removed

    # The model servers are pods with loopback IPs; picker's endpoints are exactly those, learned from the API
    # server (its command line names the pool, never an endpoint list) under the chart's ServiceAccount.
    pods = doc["pods"]
    assert sorted(pods) == ["model-server-1", "model-server-2"]
    assert all(ipaddress.ip_address(a.rsplit(":", 1)[0]).is_loopback for a in pods.values())
    assert doc["discovered"] == sorted(pods.values())
    argv = doc["picker_argv"]
    assert "--pool-name=demo" in argv
    assert "--pool-namespace=picker-demo" in argv
    assert not any(a.startswith("--endpoints") for a in argv)
    assert argv[argv.index("--kubeconfig") + 1].endswith("picker.kubeconfig")  # a token of the chart's SA only
    port = next(iter(pods.values())).rsplit(":", 1)[1]
    assert f"kubernetes: pool selector app=picker-demo-sim, target ports {port}; listing pods" in doc["picker_log"]
    assert "kubernetes: 2 endpoints, synced" in doc["picker_log"]

    # The table: both phases, every request answered, each pod served.
    rr, picker = doc["phases"]
    assert (rr["label"], picker["label"]) == ("envoy round robin", "envoy + picker")
    for phase in (rr, picker):
        s = phase["summary"]
        assert s["ok"] == s["requests"] > 15, s
        assert set(phase["shares"]) == set(pods)
        assert all(share > 0 for share in phase["shares"].values())
    assert [p["name"] for p in doc["processes"]] == ["sims", "envoy", "sims", "picker", "envoy"]
    assert all(p["returncode"] == 0 for p in doc["processes"])
    assert re.search(r"│ envoy round robin .*│\s*│\n│ envoy \+ picker .*│\s*│", out), out
    assert "control plane up in" in out
    assert "helm installed demo into picker-demo" in out


def test_kube_demo_ctrl_c_stops_the_control_plane_too(tmp_path: Path) -> None:
    proc = start([], tmp_path)
    assert proc.stdout is not None
    seen = b""
    deadline = time.monotonic() + 60
    while b"started envoy" not in seen:  # the cluster, the chart and the first phase's stack are up
        line = proc.stdout.readline()
        assert line, seen.decode(errors="replace")
        assert time.monotonic() < deadline, seen.decode(errors="replace")
        seen += line
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    code, out = finish_demo(proc, 30.0)
    text = seen.decode() + out
    assert code == 128 + signal.SIGINT, text
    assert "SIGINT: stopped" in out
    assert_nothing_left(proc.pid)
    folder = re.search(r"control plane up in .* \(https://127\.0\.0\.1:\d+, (\S+)\)", text)
    assert folder is not None, text
    assert not Path(folder.group(1)).exists()
