"""What picker promises on Envoy, checked on NGINX Gateway Fabric's real data path (nginx + njs + NGF's
``epp.js`` + NGF's shim): large prompts, admission and shedding, a picker restart, model rewrite and control
headers, and leases without response phases. Each test pins what a client of NGF gets; docs/gateways.md's table
"Envoy and NGINX Gateway Fabric" cites them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from picker.bench import ngf
from picker.bench.policies import REFERENCE_CONFIG_TEXT
from tests.e2e.backends import Backend
from tests.e2e.ngf_stack import access_log, nginx_only, post, stack
from tests.e2e.procs import free_port, run_picker

pytestmark = pytest.mark.e2e

IN_FILE = "Error in ngx.fetch: Error: request body is in a file"


def body_of(size_bytes: int) -> bytes:
    """A completions body of exactly ``size_bytes``."""
    head, tail = b'{"model":"m","max_tokens":2,"prompt":"', b'"}'
    return head + b"x" * (size_bytes - len(head) - len(tail)) + tail


async def metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    """The sum of one metric's samples (0 when absent)."""
    async with session.get(url) as resp:
        text = await resp.text()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


@pytest.mark.parametrize(
    ("body_buffer", "size_bytes", "routed", "status"),
    [
        (None, 8 * 1024, True, 200),  # fits nginx's default 16 KiB body buffer: epp.js reads r.requestText
        (None, 32 * 1024, False, 200),  # buffered to a file: njs can't read it, the pool serves it unrouted
        (None, 2 * 1024 * 1024, False, 413),  # over nginx's default client_max_body_size (1 MiB)
        ("4m", 32 * 1024, True, 200),  # client_body_buffer_size 4m: in memory again
        ("4m", 3 * 1024 * 1024, True, 200),
    ],
    ids=["default-8k", "default-32k", "default-2m", "buffer4m-32k", "buffer4m-3m"],
)
async def test_large_prompts(
    tmp_path: Path, body_buffer: str | None, size_bytes: int, routed: bool, status: int
) -> None:
    async with stack(tmp_path, body_buffer=body_buffer) as s, aiohttp.ClientSession() as session:
        got, headers, _ = await post(session, f"{s.url}/v1/completions", body_of(size_bytes))
        (line,) = await access_log(s.directory, 1)
        error_log = (s.directory / "error.log").read_text()
    assert got == status
    picked = line.split(" ")[3]
    if routed:
        assert (picked, headers["x-backend"]) == (f'"{s.backends[1].hostport}"', "b1")
        assert len(s.backends[1].served[0].body["prompt"]) == size_bytes - 40  # the whole body reached it
    else:
        assert picked == '""'  # $inference_workload_endpoint empty: picker never saw the request
    assert (IN_FILE in error_log) == (not routed and status == 200)


ADMISSION_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: max-score-picker
- type: utilization-detector
saturationDetector: {pluginRef: utilization-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
flowControl:
  maxRequests: 1
  defaultRequestTTL: 1s
"""


@pytest.mark.parametrize("failure_mode", [ngf.FAIL_OPEN, ngf.FAIL_CLOSE])
async def test_shed_and_expired_requests_reach_the_pool_not_the_client(tmp_path: Path, failure_mode: str) -> None:
    """Every backend's queue (10) is over the detector's threshold (5): the pool is saturated. Flow control queues
    one request (1 s TTL: then 503) and rejects the next (429, queue full). Behind Envoy the client gets those
    statuses; behind NGF epp.js drops them and the pool's upstream serves both requests."""
    args = ["--config-text", ADMISSION_CONFIG]
    async with (
        stack(tmp_path, failure_mode=failure_mode, queues=(10, 10, 10), picker_args=args) as s,
        aiohttp.ClientSession() as session,
    ):
        first = asyncio.ensure_future(post(session, f"{s.url}/v1/completions", {"model": "m", "prompt": "a"}))
        await asyncio.sleep(0.3)  # the first waits in picker's queue
        second = await post(session, f"{s.url}/v1/completions", {"model": "m", "prompt": "b"})
        results = [await first, second]
        lines = await access_log(s.directory, 2)
        error_log = (s.directory / "error.log").read_text()
    assert [status for status, _, _ in results] == [200, 200]
    assert [ln.split(" ")[3] for ln in lines] == ['""', '""']  # no pick: NGF's map sent both to the pool
    assert "status: 429; body: inference error: ResourceExhausted" in error_log
    assert "status: 503; body: inference error: ServiceUnavailable" in error_log
    assert sum(len(b.served) for b in s.backends) == 2


async def test_picker_restart(tmp_path: Path) -> None:
    """picker stops and a new one starts on the same port: the shim dials picker anew for every request, so the
    first request after the restart is routed again; in the gap the pool's upstream serves (FailClose too)."""
    backends = [Backend(f"b{i}", queue=q) for i, q in enumerate((10, 0, 5))]
    for b in backends:
        await b.start()
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    args = [
        "--endpoints", ",".join(b.hostport for b in backends), "--host", "127.0.0.1",
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port),
        "--refresh-metrics-interval", "50ms", "--config-text", REFERENCE_CONFIG_TEXT,
    ]  # fmt: skip
    health = f"http://127.0.0.1:{metrics_port}/metrics"
    directory = tmp_path / "nginx"
    body = {"model": "m", "prompt": "p"}
    try:
        async with (
            ngf.run_shim(),
            nginx_only(directory, backends, grpc_port, failure_mode=ngf.FAIL_CLOSE, body_buffer=None) as (url, _),
            aiohttp.ClientSession() as session,
        ):
            async with run_picker(args, health_url=health):
                await asyncio.sleep(0.3)  # a few scrapes
                before = await post(session, f"{url}/v1/completions", body)
            gap = await post(session, f"{url}/v1/completions", body)
            async with run_picker(args, health_url=health):
                await asyncio.sleep(0.3)
                after = await post(session, f"{url}/v1/completions", body)
            lines = await access_log(directory, 3)
    finally:
        for b in backends:
            await b.stop()
    assert [status for status, _, _ in (before, gap, after)] == [200, 200, 200]
    assert (before[1]["x-backend"], after[1]["x-backend"]) == ("b1", "b1")
    picked = [ln.split(" ")[3] for ln in lines]
    assert picked == [f'"{backends[1].hostport}"', '""', f'"{backends[1].hostport}"']


async def test_model_rewrite_and_control_headers_are_not_applied(tmp_path: Path) -> None:
    """picker decides for the rewritten model and answers the shim with the new body and header changes; NGF's
    shim reads only the destination, so the model server gets the client's body and headers unchanged. A client's
    own destination header is never followed (the shim takes the destination from picker's answer alone)."""
    async with stack(tmp_path) as s, aiohttp.ClientSession() as session:
        client_headers = {
            "x-gateway-model-name-rewrite": "m-target",
            "x-gateway-inference-objective": "chat",
            "x-gateway-destination-endpoint": s.backends[0].hostport,  # never honoured
        }
        status, headers, _ = await post(
            session, f"{s.url}/v1/completions", {"model": "m", "prompt": "p", "max_tokens": 2}, client_headers
        )
        assert (status, headers["x-backend"]) == (200, "b1")  # routed by picker, not by the client's header
    served = s.backends[1].served[0]
    assert served.body == {"model": "m", "prompt": "p", "max_tokens": 2}  # Envoy would deliver "m-target"
    assert served.headers["x-gateway-model-name-rewrite"] == "m-target"  # Envoy removes control headers
    assert served.headers["x-gateway-inference-objective"] == "chat"
    assert "x-request-id" not in served.headers  # picker's added headers are dropped too


@pytest.mark.parametrize("timeout_args", [[], ["--inflight-timeout", "1s"]], ids=["expected-duration", "timeout-1s"])
async def test_leases_end_without_response_phases(tmp_path: Path, timeout_args: list[str]) -> None:
    """NGF's shim never reports the response: picker holds each lease for the request's expected duration
    (2 s + 2 output tokens x 50 ms here), or ``--inflight-timeout`` if shorter, then releases it."""
    async with stack(tmp_path, picker_args=timeout_args) as s, aiohttp.ClientSession() as session:
        for i in range(3):
            status, _, _ = await post(
                session, f"{s.url}/v1/completions", {"model": "m", "prompt": f"{i}", "max_tokens": 2}
            )
            assert status == 200
        sent_at = asyncio.get_running_loop().time()
        assert await metric(session, s.metrics_url, "inference_objective_running_requests") == 3
        assert await metric(session, s.metrics_url, "picker_inflight_expired_total") == 0
        while await metric(session, s.metrics_url, "picker_inflight_expired_total") < 3:
            assert asyncio.get_running_loop().time() - sent_at < 10.0, "leases were never released"
            await asyncio.sleep(0.05)
        released_after_s = asyncio.get_running_loop().time() - sent_at
        assert await metric(session, s.metrics_url, "inference_objective_running_requests") == 0
    if timeout_args:
        assert released_after_s < 1.9
    else:
        assert 1.5 < released_after_s < 4.0
