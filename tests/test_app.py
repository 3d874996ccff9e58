"""``picker serve``: flags → Settings, the in-process ``serving`` context, and the real process with SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker import app, errors, serve
from picker.bench import procs
from picker.endpoints.store import EndpointStore
from picker.extproc import tls
from picker.settings import Settings, StaticEndpoint
from tests.extproc.conftest import settings as base_settings
from tests.extproc.gateway import MODE, exchange, headers_msg


def parse(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    app.configure(parser)
    return app.settings_from_args(parser.parse_args(list(argv)))


def free_port() -> int:
    return procs.free_port()  # outside the ephemeral range: no outgoing connection takes it meanwhile


def test_defaults_are_the_reference_ones() -> None:
    s = parse()
    assert (s.server.grpc_port, s.server.health_port, s.server.metrics_port) == (9002, 9003, 9090)
    assert s.server.secure_serving is True
    assert s.server.cert_path is None
    assert s.scrape.interval_s == pytest.approx(0.1)
    assert (s.log_level, s.log_format) == ("info", "json")
    assert s.static_endpoints == ()


def test_flags_map_to_settings() -> None:
    s = parse(
        "--secure-serving=false",
        "--refresh-metrics-interval", "50ms",
        "--metrics-staleness-threshold", "2s",
        "--disable-endpoint-subset-filter",
        "--endpoints", "10.0.0.1:8000,10.0.0.2:8001",
        "--config-text", "kind: EndpointPickerConfig",
        "--gateway-profile", "nginx",
        "--explain-header",
        "--shed-status", "503",
        "--max-body-bytes", "1000",
        "--v", "4",
        "--zap-encoder", "console",
    )  # fmt: skip
    assert s.server.secure_serving is False
    assert s.scrape.interval_s == pytest.approx(0.05)
    assert s.scrape.staleness_s == pytest.approx(2.0)
    assert s.server.disable_subset_filter is True
    assert s.static_endpoints == (StaticEndpoint("10.0.0.1", 8000), StaticEndpoint("10.0.0.2", 8001))
    assert s.config_text == "kind: EndpointPickerConfig"
    assert (s.server.gateway_profile, s.server.explain_header, s.server.shed_status) == ("nginx", True, 503)
    assert s.server.max_body_bytes == 1000
    assert (s.log_level, s.log_format) == ("debug", "text")
    assert parse("--v", "4", "--log-level", "warning").log_level == "warning"


def test_hung_server_detection_is_on_unless_turned_off() -> None:
    assert parse().server.hung_server_detection is True
    assert parse("--hung-server-detection=false").server.hung_server_detection is False


@pytest.mark.parametrize(
    ("text", "seconds"), [("50ms", 0.05), ("2s", 2.0), ("1m30s", 90.0), ("0.25", 0.25), ("100us", 1e-4), ("1h", 3600.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert app.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "fast", "5x", "-1s", "1s2", "-3"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        app.parse_duration(text)


def test_a_bad_config_exits_2() -> None:
    parser = argparse.ArgumentParser()
    app.configure(parser)
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        args = parser.parse_args(["--config-text", "kind: NotAConfig", "--grpc-port", "0", "--metrics-port", "0"])
        assert serve.run(args) == 2
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


async def test_serving_publishes_static_endpoints_and_exports_metrics() -> None:
    metrics_port = free_port()
    base = base_settings(metrics_port=metrics_port)
    s = Settings(
        server=base.server,
        static_endpoints=(StaticEndpoint("10.9.0.1", 8000), StaticEndpoint("10.9.0.2", 8000)),
        config_text=base.config_text,
    )
    store = EndpointStore()
    async with app.serving(s, store=store, scrape=False) as running, aiohttp.ClientSession() as http:
        assert [e.key for e in store.current()] == ["10.9.0.1:8000", "10.9.0.2:8000"]
        assert running.health.ready
        async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        assert 'inference_pool_ready_pods{name="static"} 2.0' in text
        assert "inference_extension_info{" in text
        assert "picker_scheduling_errors_total" in text or "picker_scheduling_errors" in text
    assert not running.health.ready  # drained on the way out


async def test_picker_serve_process_routes_and_exits_0_on_sigterm() -> None:
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "picker.cli", "serve",
        "--endpoints", "127.0.0.1:9,127.0.0.2:9",
        "--host", "127.0.0.1",
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port),
        "--secure-serving=false", "--grace-period", "0.1s", "--refresh-metrics-interval", "1s",
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            for _ in range(200):  # bounded: ~20 s
                try:
                    reply = await stub.Check(health_pb2.HealthCheckRequest(service="inference-extension"), timeout=1)
                    if reply.status == health_pb2.HealthCheckResponse.SERVING:
                        break
                except grpc.aio.AioRpcError:
                    pass
                await asyncio.sleep(0.1)
            else:
                pytest.fail("picker serve never became SERVING")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            config = pb.ProtocolConfiguration(request_body_mode=MODE.BUFFERED)
            answers = await exchange(
                channel,
                [
                    headers_msg({":path": "/v1/completions"}, config=config),
                    pb.ProcessingRequest(
                        request_body=pb.HttpBody(body=b'{"model":"m","prompt":"p"}', end_of_stream=True)
                    ),
                ],
            )
            dest = answers[1].request_body.response.header_mutation.set_headers[0].header.raw_value
            assert dest in (b"127.0.0.1:9", b"127.0.0.2:9")
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        assert proc.stdout is not None
        output = (await proc.stdout.read()).decode(errors="replace")
    assert '"msg":"picker serving"' in output
    assert '"msg":"picker stopped"' in output


async def test_a_port_in_use_is_a_config_error() -> None:
    async with app.serving(base_settings(), store=EndpointStore(), scrape=False) as first:
        taken = base_settings(grpc_port=first.grpc_port)
        with pytest.raises(errors.ConfigError, match="cannot listen on"):
            async with app.serving(taken, store=EndpointStore(), scrape=False):
                pass


async def test_a_metrics_port_in_use_is_a_config_error_and_frees_what_started() -> None:
    with socket.socket() as probe:  # a free port for the ext_proc server, known in advance
        probe.bind(("127.0.0.1", 0))
        grpc_port = probe.getsockname()[1]
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        settings = base_settings(grpc_port=grpc_port, metrics_port=taken)
        with pytest.raises(errors.ConfigError, match=f"cannot listen on 127.0.0.1:{taken} \\(--metrics-port\\)"):
            async with app.serving(settings, store=EndpointStore(), scrape=False):
                pass
    # What it had started was stopped: the ext_proc port is free again.
    async with app.serving(base_settings(grpc_port=grpc_port), store=EndpointStore(), scrape=False) as running:
        assert running.grpc_port == grpc_port


@pytest.mark.parametrize("flag", ["--grpc-port", "--grpc-health-port", "--metrics-port", "--peer-port"])
@pytest.mark.parametrize("value", ["-1", "65536", "http"])
def test_a_port_flag_out_of_range_is_a_usage_error(flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="picker serve")
    app.configure(parser)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([f"{flag}={value}"])
    assert exited.value.code == 2
    assert f"argument {flag}: '{value}'" in capsys.readouterr().err


def test_a_missing_cert_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="cert-path"):
        tls.load_pair(str(tmp_path))


async def test_serve_freezes_the_start_up_heap_out_of_the_collectors_reach() -> None:
    """Full collections walked every object start-up made (~50 ms each under load): ``serve`` freezes them."""
    assert gc.get_freeze_count() == 0
    task = asyncio.create_task(app.serve(base_settings(grace_period_s=0.0)))
    try:
        async with asyncio.timeout(20):
            while gc.get_freeze_count() == 0:
                assert not task.done(), task
                await asyncio.sleep(0.05)
        assert gc.get_freeze_count() > 10_000  # the modules, the configuration, the servers
        os.kill(os.getpid(), signal.SIGTERM)  # serve's own handler: a clean stop
        assert await asyncio.wait_for(task, 20) == 0
    finally:
        task.cancel()
        gc.unfreeze()  # this test process goes on to other tests
