"""Graceful shutdown and restarts behind the real Envoy, under steady load.

Envoy's ext_proc cluster is the picker replicas, actively health-checked over gRPC (service ``readiness``, every
200 ms, one failure marks a host down) on each picker's health port, with the panic threshold at 0 so Envoy never
sends a stream to a host it saw unhealthy — the way a gateway fed from a Service's ready endpoints behaves. Body mode
BUFFERED with ``failure_mode_allow: false`` (FailClose): a full-duplex stream cannot move to another picker mid-body,
and FailClose makes every stream that finds no picker a visible 5xx.

- Two replicas, one gets SIGTERM mid-run: its health turns NOT_SERVING at once, Envoy moves new streams to the
  other within a health-check interval, the streams it already has (slow backends keep several in flight) finish,
  and it exits 0. No request fails.
- One replica, restarted as a ``Recreate`` rollout does (SIGTERM, wait for exit, start a new one): requests in the
  gap fail with FailClose and are routed to any pod without picker with FailOpen. Measured, not asserted in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from picker.bench import envoy as envoy_config
from tests.e2e.backends import Backend
from tests.e2e.procs import free_port, run_envoy, run_picker, stop_process

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

HC_INTERVAL = "0.2s"
RATE_PER_S = 20.0
GRACE = "1s"  # --grace-period: streams still accepted this long after health turns NOT_SERVING
TERMINATION_GRACE_S = 10.0


@dataclass
class Replica:
    grpc_port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)

    def args(self, backends: Sequence[Backend]) -> list[str]:
        return [
            "--endpoints", ",".join(b.hostport for b in backends),
            "--host", "127.0.0.1",
            "--grpc-port", str(self.grpc_port),
            "--grpc-health-port", str(self.health_port),
            "--metrics-port", str(self.metrics_port),
            "--secure-serving=false",
            "--refresh-metrics-interval", "50ms",
            "--grace-period", GRACE,
            "--termination-grace", f"{TERMINATION_GRACE_S}s",
        ]  # fmt: skip

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def envoy_yaml(
    listen_ports: dict[bool, int], admin_port: int, replicas: Sequence[Replica], backends: list[Backend]
) -> str:
    """The e2e gateway config, with the picker cluster made of ``replicas`` (health-checked) and one listener per
    failure mode: ``listen_ports[failure_mode_allow]``."""
    base: dict[str, Any] = yaml.safe_load(
        envoy_config.render(
            listen_port=listen_ports[False],
            admin_port=admin_port,
            picker_port=replicas[0].grpc_port,
            backends=[("127.0.0.1", b.port) for b in backends],
            body_mode="BUFFERED",
            failure_mode_allow=False,
            picker_tls=False,
        )
    )
    resources = base["static_resources"]
    picker = next(c for c in resources["clusters"] if c["name"] == "picker")
    picker["load_assignment"]["endpoints"] = [
        {
            "lb_endpoints": [
                {
                    "endpoint": {
                        "address": {"socket_address": {"address": "127.0.0.1", "port_value": r.grpc_port}},
                        "health_check_config": {"port_value": r.health_port},
                    }
                }
                for r in replicas
            ]
        }
    ]
    picker["health_checks"] = [
        {
            "timeout": "1s",
            "interval": HC_INTERVAL,
            "no_traffic_interval": HC_INTERVAL,
            "unhealthy_threshold": 1,
            "healthy_threshold": 1,
            "grpc_health_check": {"service_name": "readiness"},
        }
    ]
    picker["common_lb_config"] = {"healthy_panic_threshold": {"value": 0.0}}
    if True in listen_ports:  # a second listener, identical but for FailOpen
        (listener,) = resources["listeners"]
        fail_open = yaml.safe_load(yaml.safe_dump(listener))
        fail_open["name"] = "gateway-fail-open"
        fail_open["address"]["socket_address"]["port_value"] = listen_ports[True]
        hcm = fail_open["filter_chains"][0]["filters"][0]["typed_config"]
        ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
        ext_proc["typed_config"]["failure_mode_allow"] = True
        resources["listeners"].append(fail_open)
    return yaml.safe_dump(base, sort_keys=False)


async def healthy_hosts(session: aiohttp.ClientSession, admin_port: int) -> set[int]:
    """The picker ports Envoy currently considers healthy."""
    async with session.get(f"http://127.0.0.1:{admin_port}/clusters") as resp:
        text = await resp.text()
    ports = set()
    for line in text.splitlines():
        name, _, rest = line.partition("::")
        if name == "picker" and rest.endswith("::health_flags::healthy"):
            ports.add(int(rest.split("::")[0].rpartition(":")[2]))
    return ports


async def wait_healthy(session: aiohttp.ClientSession, admin_port: int, ports: set[int], timeout_s: float = 20) -> None:
    async with asyncio.timeout(timeout_s):
        while await healthy_hosts(session, admin_port) != ports:  # noqa: ASYNC110 - polling Envoy's admin API
            await asyncio.sleep(0.05)


@dataclass
class Result:
    sent_at: float
    status: int
    backend: str


@dataclass
class Load:
    """Open-loop load: one request every 1/rate seconds, whatever the answers; every result kept."""

    session: aiohttp.ClientSession
    url: str
    results: list[Result] = field(default_factory=list)

    async def one(self, i: int) -> None:
        sent = time.monotonic()
        body = orjson.dumps({"model": "m", "prompt": f"request {i}", "max_tokens": 2})
        try:
            async with self.session.post(
                f"{self.url}/v1/completions", data=body, headers={"content-type": "application/json"}
            ) as resp:
                await resp.read()
                self.results.append(Result(sent, resp.status, resp.headers.get("x-backend", "")))
        except aiohttp.ClientError:
            self.results.append(Result(sent, 0, ""))

    async def run(self, duration_s: float, rate_per_s: float = RATE_PER_S) -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(int(duration_s * rate_per_s)):
                tg.create_task(self.one(i))
                await asyncio.sleep(1 / rate_per_s)

    async def run_until(self, stop: asyncio.Event, rate_per_s: float, max_requests: int = 1000) -> None:
        async with asyncio.TaskGroup() as tg:
            for i in range(max_requests):
                if stop.is_set():
                    break
                tg.create_task(self.one(i))
                await asyncio.sleep(1 / rate_per_s)

    def failed(self) -> list[Result]:
        return [r for r in self.results if r.status != 200]


@contextlib.asynccontextmanager
async def backends(n: int, delay_s: float) -> AsyncIterator[list[Backend]]:
    started = [Backend(f"b{i}", queue=0, delay_s=delay_s) for i in range(n)]
    try:
        for b in started:
            await b.start()
        yield started
    finally:
        for b in started:
            await b.stop()


async def test_sigterm_to_one_of_two_replicas_fails_no_request() -> None:
    a, b = Replica(), Replica()
    listen_port, admin_port = free_port(), free_port()
    async with (
        backends(2, delay_s=0.3) as servers,  # ~6 streams in flight at any moment at 20 req/s
        run_picker(a.args(servers), health_url=a.metrics_url) as proc_a,
        run_picker(b.args(servers), health_url=b.metrics_url),
        run_envoy(envoy_yaml({False: listen_port}, admin_port, [a, b], servers), admin_port),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        await wait_healthy(session, admin_port, {a.grpc_port, b.grpc_port})
        load = Load(session, f"http://127.0.0.1:{listen_port}")
        running = asyncio.create_task(load.run(duration_s=4.0))
        await asyncio.sleep(1.5)
        proc_a.terminate()  # SIGTERM mid-run, with streams in flight on it
        terminated_at = time.monotonic()
        exit_code = await asyncio.wait_for(proc_a.wait(), TERMINATION_GRACE_S + 5)
        exited_after_s = time.monotonic() - terminated_at
        await running
        assert await healthy_hosts(session, admin_port) == {b.grpc_port}

    assert len(load.results) == 80
    assert load.failed() == []
    assert exit_code == 0
    assert exited_after_s < TERMINATION_GRACE_S  # drained, not cut off at the deadline
    served_after = [r for r in load.results if r.sent_at > terminated_at]
    assert len(served_after) > 30  # the bulk of the run came after the SIGTERM and went through the survivor
    print(f"\ntwo replicas: {len(load.results)} requests, 0 failed; SIGTERM→exit 0 in {exited_after_s:.2f}s")


async def test_one_replica_restart_gap_fails_close_and_routes_without_picker_open() -> None:
    """A ``Recreate`` restart of the only replica: SIGTERM, wait for the exit, start a new one on the same ports."""
    replica = Replica()
    ports = {False: free_port(), True: free_port()}
    admin_port = free_port()
    async with (
        backends(2, delay_s=0.05) as servers,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        contextlib.AsyncExitStack() as first,
    ):
        old = await first.enter_async_context(run_picker(replica.args(servers), health_url=replica.metrics_url))
        async with run_envoy(envoy_yaml(ports, admin_port, [replica], servers), admin_port):
            await wait_healthy(session, admin_port, {replica.grpc_port})
            close = Load(session, f"http://127.0.0.1:{ports[False]}")
            open_ = Load(session, f"http://127.0.0.1:{ports[True]}")
            stop = asyncio.Event()
            loads = asyncio.gather(close.run_until(stop, RATE_PER_S / 2), open_.run_until(stop, RATE_PER_S / 2))
            await asyncio.sleep(1.0)
            sigterm_at = time.monotonic()
            assert await stop_process(old, TERMINATION_GRACE_S + 5) == 0
            exited_at = time.monotonic()
            await first.aclose()
            async with run_picker(replica.args(servers), health_url=replica.metrics_url):
                await wait_healthy(session, admin_port, {replica.grpc_port})
                healthy_at = time.monotonic()
                await asyncio.sleep(1.0)  # steady again: the new picker serves
                stop.set()
                await loads

    before = [r for r in close.results if r.sent_at < sigterm_at]
    after = [r for r in close.results if r.sent_at > healthy_at + 0.5]
    gap = [r for r in close.results if r.status != 200]
    assert before
    assert all(r.status == 200 for r in before)
    assert after
    assert all(r.status == 200 for r in after)
    assert gap, "FailClose: requests in the restart gap fail"
    assert {r.status for r in gap} <= {500, 502, 503, 504}
    assert all(sigterm_at <= r.sent_at <= healthy_at for r in gap)
    # FailOpen: every request is served; those in the gap went to a pod without picker (round robin).
    assert open_.failed() == []
    print(
        f"\none replica, Recreate restart: SIGTERM→exit {exited_at - sigterm_at:.2f}s, exit→healthy "
        f"{healthy_at - exited_at:.2f}s; FailClose: {len(gap)}/{len(close.results)} failed, first "
        f"{min(r.sent_at for r in gap) - sigterm_at:.2f}s after SIGTERM, last "
        f"{max(r.sent_at for r in gap) - sigterm_at:.2f}s; FailOpen: 0/{len(open_.results)} failed"
    )
