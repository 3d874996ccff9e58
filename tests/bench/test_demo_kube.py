"""``picker demo --kube`` without a control plane: the message when its tools are not built, and the chart's
``picker serve`` arguments made local. The demo itself runs in tests/cluster/test_demo.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from picker import cli
from picker.bench import cluster, demo_kube


@pytest.fixture
def no_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty tools folder, and an Envoy that is found (the demo checks Envoy first)."""
    envoy = tmp_path / "envoy"
    envoy.write_text("#!/bin/sh\nexit 0\n")
    envoy.chmod(0o755)
    monkeypatch.setenv("PICKER_ENVOY_BIN", str(envoy))
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setattr(cluster, "TOOLS_BIN", tools)
    return tools


def test_tools_not_built_says_how_to_build_them(no_tools: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--kube"]) == 2
    out = capsys.readouterr()
    err = out.err.strip()
    assert err.startswith("picker demo: the local control plane tools are not built"), err
    assert "kube-apiserver" in err
    assert "kwok" in err
    assert "helm" in err
    assert "run `bash scripts/install-tools.sh` (it installs helm and runs scripts/install-kube.sh" in err
    assert "Traceback" not in out.err + out.out
    assert len(err.splitlines()) == 1


def test_only_the_control_plane_missing_names_install_kube(no_tools: Path) -> None:
    (no_tools / "helm").write_text("")
    (no_tools / "kubectl").write_text("")
    missing = [n for n in cluster.BINARIES if n != "kubectl"]
    assert cluster.missing_tools() == missing
    with pytest.raises(cluster.ToolsMissing, match=r"missing in .*: run `bash scripts/install-kube.sh`") as info:
        cluster.require_tools()
    assert "kubectl" not in str(info.value).split("missing")[0]


def test_kube_is_refused_with_other_gateways(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--kube", "--gateway", "ngf"]) == 2
    assert "--kube compares behind Envoy only" in capsys.readouterr().err


def test_chart_argv_swaps_ports_and_config_path_only() -> None:
    chart = [
        "--pool-name=demo", "--pool-namespace=picker-demo", "--grpc-port=9002", "--grpc-health-port=9003",
        "--metrics-port=9090", "--config-file=/config/default-plugins.yaml", "--zap-encoder=json",
        "--refresh-metrics-interval=50ms", "--ha-enable-leader-election",
    ]  # fmt: skip
    ports = {"--grpc-port": 1, "--grpc-health-port": 2, "--metrics-port": 3}
    got = demo_kube.chart_argv(chart, ports, Path("/tmp/x/config"))
    assert got == [
        "--pool-name=demo", "--pool-namespace=picker-demo", "--grpc-port=1", "--grpc-health-port=2",
        "--metrics-port=3", "--config-file=/tmp/x/config/default-plugins.yaml", "--zap-encoder=json",
        "--refresh-metrics-interval=50ms", "--ha-enable-leader-election",
    ]  # fmt: skip
    with pytest.raises(cluster.ClusterError, match="without --pool-name"):
        demo_kube.chart_argv(["--endpoints=127.0.0.1:8000"], ports, Path("/c"))


def test_pod_hosts_are_loopback() -> None:
    assert demo_kube.pod_hosts(3) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    with pytest.raises(ValueError, match="1 to 250"):
        demo_kube.pod_hosts(251)
