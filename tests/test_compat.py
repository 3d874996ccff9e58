"""The reference EPP's flags: every one is accepted, the ones that act do, the others warn when they can't be honoured.

``REFERENCE_CHART_ARGS`` are the container args the reference chart (GIE ``config/charts/epplib``
``templates/_deployment.yaml``, release ``pool`` in namespace ``default``) renders for its value combinations:
the model-server types with their per-metric-name flags (quotes included, as Kubernetes passes them), more than one
replica, tracing on, Prometheus auth off, extra ``flags``, and standalone mode. Each set is parsed by the real
``picker serve`` parser, and one is run as a real process against the stand-in API server.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import orjson
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker import app, compat
from picker.bench.policies import REFERENCE_CONFIG_TEXT  # the reference chart's default-plugins.yaml
from picker.discovery import kubesettings
from picker.telemetry import tracing
from tests.extproc.gateway import EnvoyFullDuplex, gateway
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import pod, pool
from tests.telemetry.otlp_receiver import receiver
from tests.test_app_kube import free_port

POOL = ["--pool-name", "pool", "--pool-namespace", "default", "--pool-group", "inference.networking.k8s.io"]
TAIL = ["--zap-encoder", "json", "--config-file", "/config/default-plugins.yaml"]
SGLANG = [
    '--total-queued-requests-metric="sglang:num_queue_reqs"',
    '--total-running-requests-metric="sglang:num_running_reqs"',
    '--kv-cache-usage-percentage-metric="sglang:token_usage"',
    '--cache-info-metric="sglang:cache_config_info"',
]
TRITON = [
    "--total-queued-requests-metric", "nv_trt_llm_request_metrics{request_type=waiting}",
    "--total-running-requests-metric", "nv_trt_llm_request_metrics{request_type=scheduled}",
    "--kv-cache-usage-percentage-metric", "nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
    "--lora-info-metric", "",
]  # fmt: skip
TRTLLM = [
    '--total-queued-requests-metric="trtllm_num_requests_waiting"',
    '--total-running-requests-metric="trtllm_num_requests_running"',
    '--kv-cache-usage-percentage-metric="trtllm_kv_cache_utilization"',
    '--cache-info-metric="trtllm_cache_config_info"',
    '--model-server-metrics-path="/prometheus/metrics"',
    "--lora-info-metric", "",
]  # fmt: skip
REFERENCE_CHART_ARGS: dict[str, list[str]] = {
    "vllm": [*POOL, *TAIL, "--tracing=false"],
    "vllm-auth-off": [*POOL, *TAIL, "--tracing=false", "--metrics-endpoint-auth=false"],
    "sglang": [*POOL, *SGLANG, *TAIL, "--tracing=false"],
    "triton-tensorrt-llm": [*POOL, *TRITON, *TAIL, "--tracing=false"],
    "trtllm-serve": [*POOL, *TRTLLM, *TAIL, "--tracing=false"],
    "replicas-3": [*POOL, *TAIL, "--ha-enable-leader-election", "--tracing=false"],
    "tracing": [*POOL, *TAIL, "--tracing=true"],
    "flags": [
        *POOL, *TAIL,
        "--enable-pprof=true", "--health-checking=true", "--refresh-metrics-interval=50ms", "--v=3",
        "--tracing=true", "--metrics-endpoint-auth=false",
    ],
    "standalone": [
        "--endpoint-selector", "app=vllm", "--endpoint-target-ports", "8000", *TAIL, "--tracing=false",
    ],
}  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="picker serve")
    app.configure(p)
    return p


@pytest.mark.parametrize("case", sorted(REFERENCE_CHART_ARGS))
def test_reference_chart_args_parse(case: str) -> None:
    args = parser().parse_args(REFERENCE_CHART_ARGS[case])
    settings = app.settings_from_args(args)
    kube = kubesettings.settings_from_args(args, {"POD_NAME": "pool-epp-abc"})
    assert kube is not None
    assert args.config_file == "/config/default-plugins.yaml"
    assert settings.server.tracing is (case in ("tracing", "flags"))
    warnings = compat.unhonoured(args)
    engine = {"sglang": "sglang", "triton-tensorrt-llm": "triton", "trtllm-serve": "trtllm"}.get(case)
    if engine:
        (advice,) = [w for w in warnings if "defaultEngine" in w]
        assert engine in advice
    else:
        assert not [w for w in warnings if "defaultEngine" in w]
    if case == "trtllm-serve":
        assert any("--model-server-metrics-path" in w for w in warnings)
    if case == "flags":
        assert settings.server.enable_pprof
        assert settings.server.health_checking
        assert settings.scrape.interval_s == pytest.approx(0.05)
    assert not [w for w in warnings if "metrics-endpoint-auth" in w]  # auth is false or absent in every case


def test_every_reference_flag_is_accepted() -> None:
    """GIE's options.go flags plus controller-runtime's zap flags and --kubeconfig, each with a value."""
    reference = {
        "grpc-port": "9002", "ha-enable-leader-election": "false", "pool-group": "inference.networking.k8s.io",
        "pool-namespace": "default", "pool-name": "pool", "endpoint-selector": "", "endpoint-target-ports": "",
        "model-server-metrics-scheme": "http", "model-server-metrics-path": "/metrics",
        "model-server-metrics-port": "0", "model-server-metrics-https-insecure-skip-verify": "true",
        "refresh-metrics-interval": "50ms", "refresh-prometheus-metrics-interval": "5s",
        "metrics-staleness-threshold": "2s", "total-queued-requests-metric": "vllm:num_requests_waiting",
        "total-running-requests-metric": "vllm:num_requests_running",
        "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc", "lora-info-metric": "vllm:lora_requests_info",
        "cache-info-metric": "vllm:cache_config_info", "v": "2", "tracing": "true", "health-checking": "false",
        "metrics-port": "9090", "grpc-health-port": "9003", "enable-pprof": "true", "cert-path": "/tls",
        "enable-cert-reload": "false", "secure-serving": "true", "metrics-endpoint-auth": "false",
        "config-file": "/config/c.yaml", "config-text": "", "zap-devel": "true", "zap-encoder": "json",
        "zap-log-level": "info", "zap-stacktrace-level": "error", "zap-time-encoding": "iso8601",
        "kubeconfig": "/kube/config",
    }  # fmt: skip
    args = parser().parse_args([f"--{k}={v}" for k, v in reference.items()])
    assert compat.unhonoured(args) == []  # reference defaults everywhere: nothing to warn about
    assert app.settings_from_args(args).log_level == "info"


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--model-server-metrics-scheme=https", "http only"),
        ("--model-server-metrics-port=9400", "own port"),
        ("--lora-info-metric=my:lora", "defaultEngine"),
    ],
)
def test_values_picker_cannot_honour_warn(flag: str, expected: str) -> None:
    (warning,) = compat.unhonoured(parser().parse_args([flag]))
    assert expected in warning


def test_cert_reload_metrics_auth_and_health_checking_act_without_warnings() -> None:
    """Issue 11 implements --enable-cert-reload and --metrics-endpoint-auth (tls.py, tokenreview.py): no warning."""
    args = parser().parse_args(["--enable-cert-reload=true", "--metrics-endpoint-auth=true"])
    assert compat.unhonoured(args) == []
    server = app.settings_from_args(args).server
    assert (server.cert_reload, server.metrics_endpoint_auth, server.health_checking) == (True, True, True)
    off = app.settings_from_args(
        parser().parse_args(["--enable-cert-reload=false", "--metrics-endpoint-auth=false", "--health-checking=false"])
    ).server
    assert (off.cert_reload, off.metrics_endpoint_auth, off.health_checking) == (False, False, False)


@pytest.mark.parametrize(("value", "level"), [("debug", "debug"), ("error", "error"), ("5", "debug"), ("2", "info")])
def test_zap_log_level(value: str, level: str) -> None:
    assert app.settings_from_args(parser().parse_args([f"--zap-log-level={value}"])).log_level == level


def test_bad_values_are_errors() -> None:
    for bad in (["--tracing=maybe"], ["--zap-log-level=loud"], ["--refresh-prometheus-metrics-interval=soon"]):
        with pytest.raises(SystemExit):
            parser().parse_args(bad)


async def test_picker_starts_with_the_reference_chart_args(tmp_path: Path) -> None:
    """The "flags" args (tracing, pprof, health checking) plus the sglang metric flags, as a real process: it routes
    to the pool's pod, serves health on the ext_proc port, answers /debug/pprof/, warns, and exports its spans."""
    config = tmp_path / "default-plugins.yaml"
    config.write_text(REFERENCE_CONFIG_TEXT)
    args = [a.replace("/config/default-plugins.yaml", str(config)) for a in REFERENCE_CHART_ARGS["flags"]]
    args += SGLANG
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    log_path = tmp_path / "picker.log"
    async with FakeApiServer() as api, receiver() as collector:
        api.create("inferencepools", pool(ports=(8000,)))
        api.create("pods", pod("p1", "10.1.2.3"))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": api.url}}],
            "users": [{"name": "anonymous", "user": {}}],
            "contexts": [{"name": "test", "context": {"cluster": "stand-in", "user": "anonymous"}}],
            "current-context": "test",
        }))  # fmt: skip
        env = dict(
            os.environ,
            POD_NAME="pool-epp-abc",
            KUBERNETES_SERVICE_HOST="",
            OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
            OTEL_BSP_SCHEDULE_DELAY="50",
        )
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "picker.cli", "serve", *args,
                "--kubeconfig", str(kubeconfig), "--host", "127.0.0.1", "--secure-serving=false",
                "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port),
                "--metrics-port", str(metrics_port), "--grace-period", "0.2s",
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        try:
            target = f"127.0.0.1:{grpc_port}"
            await _serving(target, "")  # --health-checking: health on the ext_proc port itself
            async with gateway(EnvoyFullDuplex, target) as gw:
                body = orjson.dumps({"model": "m", "prompt": "hi", "max_tokens": 4})
                out = await gw.request({":path": "/v1/completions", "content-type": "application/json"}, [body])
            assert out.destination == "10.1.2.3:8000"
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{metrics_port}/debug/pprof/goroutine") as resp:
                    assert resp.status == 200
                    assert "asyncio tasks:" in await resp.text()
                async with http.get(f"http://127.0.0.1:{metrics_port}/debug/pprof/profile?seconds=0.2") as resp:
                    assert resp.status == 200
                    assert "function calls" in await resp.text()
            (span,) = await collector.wait_for(tracing.REQUEST_SPAN)
            assert span.attributes["picker.destination"] == "10.1.2.3:8000"
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 20)
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    logged = log_path.read_text()
    assert proc.returncode == 0, logged
    assert "defaultEngine (sglang)" in logged
    assert "unrecognized arguments" not in logged


async def _serving(target: str, service: str, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s), grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.1)
