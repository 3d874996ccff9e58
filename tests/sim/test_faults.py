"""Failure injection: decisions (unit) and their effect over real HTTP."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import aiohttp
import orjson
import pytest

from picker.sim.config import preset
from picker.sim.faults import Crash, ErrorReply, FaultInjector, Faults, Hang
from picker.sim.harness import running

BODY = orjson.dumps({"prompt": "hi", "max_tokens": 2})


def test_decisions_follow_the_rates() -> None:
    inj = FaultInjector(Faults(error_rate=0.3, error_types=("rate_limit", "server_error"), hang_rate=0.5), seed=1)
    kinds = Counter(type(inj.on_request()).__name__ for _ in range(2000))
    assert 500 < kinds["ErrorReply"] < 700  # ~30 %
    assert 600 < kinds["Hang"] < 800  # ~50 % of the remaining 70 %
    statuses = {d.status for d in (inj.on_request() for _ in range(200)) if isinstance(d, ErrorReply)}
    assert statuses == {429, 500}


def test_same_seed_same_decisions() -> None:
    def run() -> list[object]:
        inj = FaultInjector(Faults(error_rate=0.5, spike_rate=0.5, spike_s=0.1), seed=7)
        return [(inj.on_request(), inj.step_stall_s()) for _ in range(50)]

    assert run() == run()


def test_crash_every_nth_request() -> None:
    inj = FaultInjector(Faults(crash_after=3, crash_down_s=1.5))
    got = [inj.on_request() for _ in range(6)]
    assert got == [None, None, Crash(1.5), None, None, Crash(1.5)]


def test_no_faults_by_default() -> None:
    inj = FaultInjector(Faults())
    assert all(inj.on_request() is None and inj.step_stall_s() == 0.0 for _ in range(100))
    assert isinstance(FaultInjector(Faults(hang_rate=1.0, hang_s=2)).on_request(), Hang)


@pytest.mark.parametrize(
    "changes",
    [{"error_rate": 2}, {"error_types": ["nope"]}, {"bogus": 1}, {"hang_s": "x"}, {"crash_after": 0}, {"spike_s": -1}],
)
def test_bad_fault_settings(changes: dict[str, object]) -> None:
    with pytest.raises((ValueError, TypeError)):
        Faults().updated(changes)


async def test_injected_errors_over_http() -> None:
    faults = Faults(error_rate=1.0, error_types=("rate_limit", "invalid_api_key", "model_not_found"))
    async with running(preset("fast"), faults=faults) as srv, aiohttp.ClientSession() as http:
        statuses = set()
        for _ in range(30):
            async with http.post(f"{srv.url}/v1/completions", data=BODY) as resp:
                err = await resp.json()
                statuses.add(resp.status)
                assert err["error"]["code"] == resp.status
        assert statuses == {429, 401, 404}


async def test_runtime_fault_changes_and_spikes() -> None:
    async with running(preset("fast")) as srv, aiohttp.ClientSession() as http:
        async with http.post(f"{srv.url}/admin/faults", json={"spike_rate": 1.0, "spike_s": 0.05}) as resp:
            assert resp.status == 200
            assert (await resp.json())["spike_rate"] == 1.0
        async with http.post(f"{srv.url}/admin/faults", json={"error_rate": 7}) as resp:
            assert resp.status == 400
        async with http.get(f"{srv.url}/admin/faults") as resp:
            assert (await resp.json())["error_rate"] == 0.0
        async with http.post(f"{srv.url}/v1/completions", data=BODY) as resp:
            assert resp.status == 200
        stats = srv.engine.stats()
        assert stats.busy_s >= 0.05 * stats.steps  # every step stalled


async def test_hang_then_drop() -> None:
    async with (
        running(preset("fast"), faults=Faults(hang_rate=1.0, hang_s=0.2)) as srv,
        aiohttp.ClientSession() as http,
    ):
        with pytest.raises(aiohttp.ClientError):
            async with http.post(f"{srv.url}/v1/completions", data=BODY) as resp:
                await resp.read()
        assert not srv.engine.has_work  # a hung request never reached the engine


async def test_hang_is_bounded_by_client_timeout() -> None:
    async with running(preset("fast"), faults=Faults(hang_rate=1.0, hang_s=30)) as srv, aiohttp.ClientSession() as http:
        with pytest.raises(TimeoutError):
            async with http.post(
                f"{srv.url}/v1/completions", data=BODY, timeout=aiohttp.ClientTimeout(total=0.2)
            ) as resp:
                await resp.read()


async def test_crash_closes_the_port_and_comes_back() -> None:
    async with running(preset("fast"), faults=Faults(crash_after=2, crash_down_s=0.3)) as srv:
        async with aiohttp.ClientSession() as http:
            long = orjson.dumps({"prompt": "hi", "max_tokens": 500, "ignore_eos": True, "stream": True})
            async with http.post(f"{srv.url}/v1/completions", data=long) as resp:
                await resp.content.readline()  # request 1 is streaming
                with pytest.raises(aiohttp.ClientError):  # request 2 crashes the server
                    async with http.post(f"{srv.url}/v1/completions", data=BODY) as r2:
                        await r2.read()
                with pytest.raises(aiohttp.ClientError):  # the in-flight stream is cut
                    await resp.content.read()
        assert srv.crashed
        assert not srv.engine.has_work
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.ClientConnectionError):
                async with http.get(f"{srv.url}/health") as resp:
                    pass
        for _ in range(100):
            if not srv.crashed:
                break
            await asyncio.sleep(0.02)
        async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/health") as resp:
            assert resp.status == 200
        assert srv.crashes == 1


async def test_admin_crash_endpoint() -> None:
    async with running(preset("fast")) as srv, aiohttp.ClientSession() as http:
        async with http.post(f"{srv.url}/admin/crash", json={"down_s": None}) as resp:
            assert resp.status == 202
        for _ in range(100):
            if srv.crashed:
                break
            await asyncio.sleep(0.01)
        assert srv.crashed
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(f"{srv.url}/health"):
                pass
        await srv.restart()
        async with http.get(f"{srv.url}/health") as resp:
            assert resp.status == 200


async def test_admin_crash_rejects_bad_duration() -> None:
    async with running(preset("fast")) as srv, aiohttp.ClientSession() as http:
        async with http.post(f"{srv.url}/admin/crash", json={"down_s": -1}) as resp:
            assert resp.status == 400
        assert not srv.crashed


async def test_metrics_faults_delay_garbage_and_huge() -> None:
    async with running(preset("fast"), faults=Faults(metrics_delay_s=0.3)) as srv, aiohttp.ClientSession() as http:
        started = time.monotonic()
        async with http.get(srv.url + "/metrics") as resp:
            assert b"vllm:num_requests_waiting" in await resp.read()
        assert time.monotonic() - started >= 0.3
        srv.injector.faults = srv.injector.faults.updated({"metrics_delay_s": 0, "metrics_mode": "garbage"})
        async with http.get(srv.url + "/metrics") as resp:
            assert b"vllm:" not in await resp.read()
        srv.injector.faults = srv.injector.faults.updated({"metrics_mode": "huge", "metrics_huge_bytes": 3_000_000})
        async with http.get(srv.url + "/metrics") as resp:
            assert resp.content_length is None  # chunked: only the reader's cap stops it
            body = await resp.read()
        assert 2_900_000 < len(body) <= 3_000_000
        assert b"vllm:num_requests_waiting" in body
    with pytest.raises(ValueError, match="metrics_mode"):
        Faults(metrics_mode="bogus")


async def test_cold_start_opens_the_port_only_after_startup_s() -> None:
    import socket

    from picker.sim.server import ServerConfig, SimServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = SimServer(preset("fast"), ServerConfig(port=port, startup_s=0.5))
    started = time.monotonic()
    task = asyncio.create_task(server.start())
    await asyncio.sleep(0.2)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
    await task
    assert time.monotonic() - started >= 0.5
    try:
        async with aiohttp.ClientSession() as http, http.get(server.url + "/health") as resp:
            assert resp.status == 200
    finally:
        await server.stop()
