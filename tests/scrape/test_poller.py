"""The poller against real aiohttp servers on 127.0.0.1 whose /metrics behaviour each test sets."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from picker.endpoints.model import Endpoint, EndpointSnapshot
from picker.endpoints.store import EndpointStore
from picker.scrape import poller
from picker.scrape.share import ScrapeShare
from picker.settings import ScrapeSettings
from picker.telemetry import REGISTRY

LOGGER = "picker.scrape.poller"
FAST = ScrapeSettings(
    interval_s=0.02, timeout_s=0.2, staleness_s=1.0, fail_threshold=3, recover_threshold=2, max_response_bytes=16_384
)


def vllm_page(waiting: int, running: int = 1, kv: float = 0.5) -> bytes:
    return (
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
        f'vllm:num_requests_running{{model_name="m"}} {running}\n'
        f'vllm:kv_cache_usage_perc{{model_name="m"}} {kv}\n'
    ).encode()


class Backend:
    """Serves /metrics/<name>; ``modes[name]`` picks ok | fail | slow | hang | big | big_chunked | junk."""

    def __init__(self) -> None:
        self.modes: dict[str, str] = {}
        self.pages: dict[str, bytes] = {}
        self.hits: Counter[tuple[str, str]] = Counter()
        self.active: Counter[str] = Counter()
        self.max_active: Counter[str] = Counter()
        self.release = asyncio.Event()
        self.port = 0
        self.served_at: list[float] = []
        self.peers: dict[str, set[object]] = {}  # name -> client addresses (one per TCP connection)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/metrics/{name}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        mode = self.modes.get(name, "ok")
        self.hits[name, mode] += 1
        self.peers.setdefault(name, set()).add(
            request.transport.get_extra_info("peername") if request.transport else None
        )
        self.served_at.append(time.monotonic())
        self.active[name] += 1
        self.max_active[name] = max(self.max_active[name], self.active[name])
        try:
            if mode == "fail":
                return web.Response(status=500, text="boom")
            if mode == "slow":
                await asyncio.sleep(0.1)  # slower than the interval, faster than the timeout
            if mode == "hang":
                await asyncio.wait_for(self.release.wait(), 10)
            if mode == "big":
                return web.Response(body=b"#" * 20_000 + b"\n" + self.pages[name])
            if mode == "big_chunked":
                resp = web.StreamResponse()
                resp.enable_chunked_encoding()
                await resp.prepare(request)
                for _ in range(10):
                    await resp.write(b"# padding " + b"." * 4000 + b"\n")
                await resp.write_eof()
                return resp
            if mode == "junk":
                return web.Response(body=b"# nothing useful here\nother_metric 1\n")
            return web.Response(body=self.pages.get(name, vllm_page(0)), content_type="text/plain")
        finally:
            self.active[name] -= 1


@pytest.fixture
async def backend() -> AsyncIterator[Backend]:
    b = Backend()
    app = web.Application()
    app.router.add_get("/metrics/{name}", b.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = site._server
    assert isinstance(server, asyncio.Server)
    b.port = server.sockets[0].getsockname()[1]
    yield b
    b.release.set()
    await runner.cleanup()


@asynccontextmanager
async def polling(
    store: EndpointStore, settings: ScrapeSettings = FAST, share: ScrapeShare | None = None
) -> AsyncIterator[None]:
    task = asyncio.create_task(poller.run(store=store, settings=settings, clock=time.monotonic, share=share))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled(), "the poller ended on its own"


async def until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def ep(i: int, url: str | None, engine: str = "vllm") -> Endpoint:
    return Endpoint.create(f"10.{i // 256}.{i % 256}.1", 8000, metrics_url=url, engine=engine)


def get(store: EndpointStore, e: Endpoint) -> Endpoint:
    found = store.current().get(e.key)
    assert found is not None
    return found


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def logged(caplog: pytest.LogCaptureFixture, key: str, text: str) -> int:
    return sum(1 for r in caplog.records if getattr(r, "endpoint", None) == key and text in r.getMessage())


async def test_metrics_land_in_the_store_in_one_batch_per_tick(backend: Backend) -> None:
    eps = [ep(i, backend.url(f"b{i}")) for i in (1, 2, 3)]
    for i in (1, 2, 3):
        backend.pages[f"b{i}"] = vllm_page(waiting=i, running=10 * i, kv=0.1 * i)
    store = EndpointStore()
    store.set_endpoints(eps)
    snapshots: list[EndpointSnapshot] = []
    store.subscribe(snapshots.append)
    before = time.monotonic()
    async with polling(store, ScrapeSettings(interval_s=0.5, timeout_s=0.4)):
        await until(lambda: all(get(store, e).metrics.updated_at > 0 for e in eps))
        first = next(s for s in snapshots if any(e.metrics.updated_at for e in s))
        assert all(e.metrics.updated_at > 0 for e in first)  # all three published together
        m = get(store, eps[1]).metrics
        assert (m.waiting, m.running) == (2, 20)
        assert m.kv_usage == pytest.approx(0.2)
        assert before <= m.updated_at <= time.monotonic()
        backend.pages["b2"] = vllm_page(waiting=9)
        await until(lambda: get(store, eps[1]).metrics.waiting == 9)
    assert not any(e.excluded for e in store.current())


async def test_failures_exclude_after_the_threshold_and_recovery_readmits(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    healthy, flaky = ep(11, backend.url("h")), ep(12, backend.url("f"))
    store = EndpointStore()
    store.set_endpoints([healthy, flaky])
    seen: dict[str, int] = {}

    def on_snapshot(snap: EndpointSnapshot) -> None:
        e = snap.get(flaky.key)
        if e is not None and e.excluded and "fails_at_exclusion" not in seen:
            seen["fails_at_exclusion"] = backend.hits["f", "fail"]
        if e is not None and not e.excluded and "fails_at_exclusion" in seen and "oks_at_readmission" not in seen:
            seen["oks_at_readmission"] = backend.hits["f", "ok"] - seen["oks_before"]

    store.subscribe(on_snapshot)
    transitions_before = sample("picker_endpoint_exclusion_transitions_total", direction="excluded", reason="failing")
    async with polling(store):
        await until(lambda: get(store, flaky).metrics.updated_at > 0)
        good = get(store, flaky).metrics
        backend.modes["f"] = "fail"
        await until(lambda: get(store, flaky).excluded)
        assert seen["fails_at_exclusion"] >= FAST.fail_threshold
        at_exclusion = get(store, flaky).metrics
        assert (at_exclusion.waiting, at_exclusion.kv_usage) == (good.waiting, good.kv_usage)
        assert [e.key for e in store.current().candidates()] == [healthy.key]
        assert sample("picker_endpoint_excluded", endpoint=flaky.key) == 1.0
        fails = backend.hits["f", "fail"]
        await until(lambda: backend.hits["f", "fail"] >= fails + 5)  # keep failing: no new log lines
        assert get(store, flaky).metrics == at_exclusion  # a failed poll updates nothing
        seen["oks_before"] = backend.hits["f", "ok"]
        backend.modes["f"] = "ok"
        await until(lambda: not get(store, flaky).excluded)
        assert seen["oks_at_readmission"] >= FAST.recover_threshold
        oks = backend.hits["f", "ok"]
        await until(lambda: backend.hits["f", "ok"] >= oks + 5)
        assert sample("picker_endpoint_excluded", endpoint=flaky.key) == 0.0
    assert sample("picker_scrape_errors_total", endpoint=flaky.key, reason="http") >= FAST.fail_threshold + 5
    assert sample("picker_scrape_errors_total", endpoint=healthy.key, reason="http") == 0.0
    after = sample("picker_endpoint_exclusion_transitions_total", direction="excluded", reason="failing")
    assert after == transitions_before + 1
    assert logged(caplog, flaky.key, "failing: http: HTTP 500") == 1
    assert logged(caplog, flaky.key, "excluded from scheduling: failing") == 1
    assert logged(caplog, flaky.key, "ok again") == 1
    assert logged(caplog, flaky.key, "readmitted") == 1
    assert logged(caplog, healthy.key, "") == 0


async def test_a_slow_endpoint_is_never_polled_twice_at_once(backend: Backend) -> None:
    slow, fast = ep(21, backend.url("slow")), ep(22, backend.url("fast"))
    backend.modes["slow"] = "slow"
    store = EndpointStore()
    store.set_endpoints([slow, fast])
    async with polling(store):
        await until(lambda: backend.hits["slow", "slow"] >= 4)
        assert backend.hits["fast", "ok"] > backend.hits["slow", "slow"]  # the slow one does not hold the others
    assert backend.max_active["slow"] == 1
    assert get(store, slow).metrics.updated_at > 0
    assert not get(store, slow).excluded


async def test_a_hanging_endpoint_times_out_and_is_excluded(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    hung, fine = ep(31, backend.url("hang")), ep(32, backend.url("fine"))
    backend.modes["hang"] = "hang"
    store = EndpointStore()
    store.set_endpoints([hung, fine])
    async with polling(store):
        await until(lambda: get(store, hung).excluded)
        updated = get(store, fine).metrics.updated_at
        await until(lambda: get(store, fine).metrics.updated_at > updated)  # others keep flowing
    assert sample("picker_scrape_errors_total", endpoint=hung.key, reason="timeout") >= 1
    assert not get(store, fine).excluded
    assert logged(caplog, hung.key, "excluded from scheduling") == 1


@pytest.mark.parametrize("mode", ["big", "big_chunked"])
async def test_an_oversized_page_is_an_error(backend: Backend, mode: str) -> None:
    big = ep(41 if mode == "big" else 42, backend.url(mode))
    backend.modes[mode] = mode
    backend.pages[mode] = vllm_page(1)
    store = EndpointStore()
    store.set_endpoints([big])
    async with polling(store):
        await until(lambda: get(store, big).excluded)
    assert sample("picker_scrape_errors_total", endpoint=big.key, reason="too_large") >= FAST.fail_threshold
    assert get(store, big).metrics.updated_at == 0.0


async def test_page_without_core_series_and_refused_connection(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    junk = ep(51, backend.url("junk"))
    backend.modes["junk"] = "junk"
    with socket_closed_port() as port:
        refused = ep(52, f"http://127.0.0.1:{port}/metrics")
        store = EndpointStore()
        store.set_endpoints([junk, refused])
        async with polling(store):
            await until(lambda: get(store, junk).excluded and get(store, refused).excluded)
    assert sample("picker_scrape_errors_total", endpoint=junk.key, reason="missing") >= FAST.fail_threshold
    # A refused connection excludes at the first failed poll (nothing listens there), not after fail_threshold.
    assert sample("picker_scrape_errors_total", endpoint=refused.key, reason="refused") >= 1
    assert logged(caplog, refused.key, "excluded from scheduling: failing: 1 consecutive failed polls") == 1
    assert logged(caplog, junk.key, "failing: missing: vllm metrics page lacks vllm:num_requests_waiting") == 1


async def test_endpoints_come_and_go_between_ticks(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    a, b = ep(61, backend.url("a")), ep(62, backend.url("b"))
    unscraped = ep(63, None)
    store = EndpointStore()
    store.set_endpoints([a, unscraped])
    settings = dataclasses.replace(FAST, staleness_s=0.3)
    async with polling(store, settings):
        await until(lambda: get(store, a).metrics.updated_at > 0)
        store.set_endpoints([a, b, unscraped])
        await until(lambda: get(store, b).metrics.updated_at > 0)
        assert REGISTRY.get_sample_value("picker_endpoint_metrics_age_seconds", {"endpoint": a.key}) is not None
        store.set_endpoints([b, unscraped])
        hits_a = backend.hits["a", "ok"]
        await until(
            lambda: REGISTRY.get_sample_value("picker_endpoint_metrics_age_seconds", {"endpoint": a.key}) is None
        )
        hits_b = backend.hits["b", "ok"]
        await until(lambda: backend.hits["b", "ok"] >= hits_b + 3)
        assert backend.hits["a", "ok"] <= hits_a + 1  # at most the poll in flight when it left
        await asyncio.sleep(settings.staleness_s + 0.1)
    assert not get(store, unscraped).excluded  # never scraped, never stale
    assert not get(store, b).excluded
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_unknown_engine_is_read_as_vllm_with_one_warning(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    e1, e2 = ep(71, backend.url("x1"), engine="tgi"), ep(72, backend.url("x2"), engine="tgi")
    backend.pages["x1"] = vllm_page(4)
    store = EndpointStore()
    store.set_endpoints([e1, e2])
    async with polling(store):
        await until(lambda: get(store, e1).metrics.waiting == 4)
    assert sum("unknown engine 'tgi'" in r.getMessage() for r in caplog.records) == 1


async def test_each_endpoint_is_polled_on_one_kept_connection(backend: Backend) -> None:
    e1, e2 = ep(81, backend.url("k1")), ep(82, backend.url("k2"))
    store = EndpointStore()
    store.set_endpoints([e1, e2])
    async with polling(store):
        await until(lambda: backend.hits["k1", "ok"] >= 6 and backend.hits["k2", "ok"] >= 6)
    assert len(backend.peers["k1"]) == 1  # six polls, one TCP connection
    assert len(backend.peers["k2"]) == 1
    assert backend.peers["k1"] != backend.peers["k2"]


class socket_closed_port:
    """A local port with nothing listening (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        return None


async def test_a_new_metrics_url_starts_the_endpoint_over(backend: Backend, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    broken = ep(91, backend.url("broken"))
    backend.modes["broken"] = "fail"
    store = EndpointStore()
    store.set_endpoints([broken])
    async with polling(store):
        await until(lambda: get(store, broken).excluded)
        moved = ep(91, backend.url("moved"))
        backend.pages["moved"] = vllm_page(6)
        store.set_endpoints([moved])  # same ip:port, new metrics URL: the store resets metrics and exclusion
        await until(lambda: get(store, moved).metrics.waiting == 6)
        hits = backend.hits["moved", "ok"]
        await until(lambda: backend.hits["moved", "ok"] >= hits + 3)
        assert not get(store, moved).excluded
        assert sample("picker_endpoint_excluded", endpoint=moved.key) == 0.0
    assert logged(caplog, broken.key, "readmitted") == 0  # a fresh start, not a recovery


async def test_each_sample_notes_pickers_own_requests_once_its_page_arrived(backend: Backend) -> None:
    # What the server reports can include only what picker had sent by the time the page was served, so the
    # poll reads picker's count after the page arrived, once per page, and the sample carries that value.
    e = ep(1, backend.url("b1"))
    backend.pages["b1"] = vllm_page(waiting=4, running=3)
    calls: list[tuple[float, int]] = []

    def own_requests(key: str) -> int:
        assert key == e.key
        calls.append((time.monotonic(), len(calls) + 10))
        return calls[-1][1]

    store = EndpointStore()
    store.set_endpoints([e])
    served = backend.served_at
    task = asyncio.create_task(poller.run(store=store, settings=FAST, clock=time.monotonic, own_requests=own_requests))
    try:
        await until(lambda: len(calls) >= 3)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert len(calls) <= len(served)  # one reading per page, none without one
    assert all(called >= at for (called, _), at in zip(calls, served, strict=False))
    assert get(store, e).metrics.own_requests in {value for _, value in calls}
    assert get(store, e).metrics.waiting == 4


# -- a pod's workers share their polls (scrape/share.py), here two pollers wired to each other in process -------


def workers_pair(takeover_s: float = 0.3) -> tuple[ScrapeShare, ScrapeShare]:
    """Two workers' shares, each publishing straight into the other (what the exchange does every 5 ms)."""
    a, b = ScrapeShare(0, 2, takeover_s=takeover_s), ScrapeShare(1, 2, takeover_s=takeover_s)
    a.publish = lambda scrapes: b.receive(scrapes, time.monotonic())
    b.publish = lambda scrapes: a.receive(scrapes, time.monotonic())
    return a, b


def stores(eps: list[Endpoint]) -> tuple[EndpointStore, EndpointStore]:
    pair = EndpointStore(), EndpointStore()
    for store in pair:
        store.set_endpoints(eps)
    return pair


async def test_two_workers_poll_each_server_once_and_both_see_every_server(backend: Backend) -> None:
    names = [f"w{i}" for i in range(8)]
    eps = [ep(i, backend.url(name)) for i, name in enumerate(names)]
    for i, name in enumerate(names):
        backend.pages[name] = vllm_page(waiting=i, running=1)
    (share_a, share_b), (store_a, store_b) = workers_pair(), stores(eps)
    owned_by_a = {e.key for e in eps if share_a.owns(e.key)}
    assert 0 < len(owned_by_a) < len(eps)
    async with polling(store_a, share=share_a), polling(store_b, share=share_b):
        await until(lambda: min(backend.hits[n, "ok"] for n in names) >= 5)
        backend.peers.clear()  # from now on: which connections poll each server
        backend.pages["w3"] = vllm_page(waiting=42)
        await until(lambda: get(store_a, eps[3]).metrics.waiting == 42 and get(store_b, eps[3]).metrics.waiting == 42)
        await until(lambda: min(len(backend.peers.get(n, ())) for n in names) >= 1)
        await asyncio.sleep(0.2)
    # one TCP connection per server: only its owner polls it (unshared, each server sees one from each poller)
    assert all(len(backend.peers[n]) == 1 for n in names), backend.peers
    now = time.monotonic()
    for store in (store_a, store_b):
        for i, e in enumerate(eps):
            m = get(store, e).metrics
            assert m.waiting == (42 if i == 3 else i)
            assert now - 1.0 < m.updated_at <= now  # dated from the page's age, on each worker's clock


async def test_a_failure_the_owner_sees_excludes_the_server_for_every_worker(backend: Backend) -> None:
    eps = [ep(i, backend.url(f"f{i}")) for i in range(4)]
    (share_a, share_b), (store_a, store_b) = workers_pair(), stores(eps)
    failing = next(e for e in eps if share_a.owns(e.key))
    backend.modes[f"f{eps.index(failing)}"] = "fail"
    errors_before = sample("picker_scrape_errors_total", endpoint=failing.key, reason="http")
    async with polling(store_a, share=share_a), polling(store_b, share=share_b):
        await until(lambda: get(store_a, failing).excluded and get(store_b, failing).excluded)
        assert not any(get(s, e).excluded for s in (store_a, store_b) for e in eps if e != failing)
        polls = backend.hits[f"f{eps.index(failing)}", "fail"]
        backend.modes[f"f{eps.index(failing)}"] = "ok"
        await until(lambda: not get(store_a, failing).excluded and not get(store_b, failing).excluded)
    # the errors were counted once, by the worker that polled (the pod's page sums the workers')
    assert sample("picker_scrape_errors_total", endpoint=failing.key, reason="http") - errors_before == polls


async def test_a_dead_workers_servers_are_polled_by_the_other_until_it_is_back(backend: Backend) -> None:
    names = [f"d{i}" for i in range(6)]
    eps = [ep(i, backend.url(name)) for i, name in enumerate(names)]
    (share_a, share_b), (store_a, store_b) = workers_pair(takeover_s=0.3), stores(eps)
    a_owns = [n for n, e in zip(names, eps, strict=True) if share_a.owns(e.key)]
    assert a_owns
    async with polling(store_b, share=share_b):
        async with polling(store_a, share=share_a):
            await until(lambda: all(backend.hits[n, "ok"] >= 3 for n in names))
        # worker a is gone: b has heard nothing about a's servers for takeover_s, and polls them itself
        backend.peers.clear()
        backend.pages[a_owns[0]] = vllm_page(waiting=77)
        target = eps[names.index(a_owns[0])]
        await until(lambda: get(store_b, target).metrics.waiting == 77)
        assert all(len(backend.peers[n]) == 1 for n in a_owns)  # b's connection
        assert not any(e.excluded for e in store_b.current())
        # a is back (a new process, same index): once b hears from it again, b stops polling a's servers
        share_a2 = ScrapeShare(0, 2, takeover_s=0.3)
        share_a2.publish = lambda scrapes: share_b.receive(scrapes, time.monotonic())
        async with polling(store_a, share=share_a2):
            await asyncio.sleep(0.3)
            hits = Counter({n: backend.hits[n, "ok"] for n in a_owns})
            await asyncio.sleep(0.4)
            polled = {n: backend.hits[n, "ok"] - hits[n] for n in a_owns}
            assert not any(share_b.due(e.key, time.monotonic()) for e in eps if share_a.owns(e.key))
    # a new poller (a2) polls each at 50 Hz; were b still polling too, each would see about twice that
    assert all(polled[n] <= 0.4 / FAST.interval_s * 1.5 for n in a_owns), polled


async def test_the_other_workers_outcomes_apply_when_they_arrive_not_at_the_next_tick(backend: Backend) -> None:
    eps = [ep(i, backend.url(f"t{i}")) for i in range(6)]
    (share_a, share_b), (store_a, store_b) = workers_pair(), stores(eps)
    from_a = [e for e in eps if share_a.owns(e.key)]
    assert from_a
    slow = dataclasses.replace(FAST, interval_s=5.0, staleness_s=30.0)  # b's own tick: every 5 s
    async with polling(store_a, share=share_a), polling(store_b, slow, share=share_b):
        await until(lambda: all(get(store_b, e).metrics.updated_at > 0 for e in from_a))
        backend.pages[f"t{eps.index(from_a[0])}"] = vllm_page(waiting=31)
        await until(lambda: get(store_b, from_a[0]).metrics.waiting == 31, timeout_s=2.0)
