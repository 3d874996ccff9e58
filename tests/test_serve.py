"""``picker serve --workers N``: the worker count, the plan, the merged /metrics page, and N real processes on one
port that schedule as one picker."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import stat
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import orjson
import pytest
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from picker import app, errors, serve
from picker.bench import procs
from picker.bench.extproc_client import build_messages
from picker.bench.policies import PREVIOUS_CONFIG_TEXT
from picker.discovery.kubesettings import KubeSettings
from picker.settings import PeerSettings, ServerSettings, Settings
from picker.telemetry.merge import CounterCarry, merge_pages

# -- how many workers ---------------------------------------------------------------------------------------


def test_cpu_limit_from_cgroup_v2_and_v1(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert serve.cpu_limit(str(tmp_path)) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert serve.cpu_limit(str(tmp_path)) is None
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert serve.cpu_limit(str(tmp_path)) == 3.0
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert serve.cpu_limit(str(tmp_path)) is None
    assert serve.cpu_limit(str(tmp_path / "absent")) is None


def test_worker_count_follows_the_cpu_limit() -> None:
    plain = Settings()
    cores = len(os.sched_getaffinity(0))
    assert serve.worker_count(0, plain, None, limit=None) == 1  # no limit: the node is shared, take one core
    assert serve.worker_count(0, plain, None, limit=0.5) == 1
    assert serve.worker_count(0, plain, None, limit=1.9) == 1
    assert serve.worker_count(0, plain, None, limit=2.0) == min(2, cores)
    assert serve.worker_count(0, plain, None, limit=64.0) == cores  # never more than the cores it may run on
    assert serve.worker_count(3, plain, None, limit=None) == 3  # as asked
    with pytest.raises(errors.ConfigError, match="--workers"):
        serve.worker_count(-1, plain, None, limit=None)


def test_workers_do_not_combine_with_leader_election_or_other_pods_peers() -> None:
    elected = KubeSettings(pool_name="p", leader_election=True)
    peered = Settings(peers=PeerSettings(peers=("10.0.0.2:9005",)))
    for settings, kube in ((Settings(), elected), (peered, None)):
        assert serve.worker_count(0, settings, kube, limit=4.0) == 1  # automatic: one
        assert serve.worker_count(1, settings, kube, limit=4.0) == 1
        with pytest.raises(errors.ConfigError, match="does not combine"):
            serve.worker_count(2, settings, kube, limit=4.0)


# -- the plan -----------------------------------------------------------------------------------------------


def test_plan_gives_each_worker_the_shared_ports_and_the_others_as_peers() -> None:
    settings = Settings(
        server=ServerSettings(host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=9090),
    )
    plan = serve.WorkerPlan.build(settings, 3)
    try:
        assert plan.grpc_port  # 0 resolved once, for all workers
        assert plan.health_port
        assert plan.cert_dir is not None
        key = Path(plan.cert_dir.name, "tls.key")
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
        assert Path(plan.cert_dir.name, "tls.crt").read_bytes().startswith(b"-----BEGIN CERTIFICATE")
        workers = [plan.settings_for(i) for i in range(3)]
        for i, w in enumerate(workers):
            assert (w.server.grpc_port, w.server.health_port) == (plan.grpc_port, plan.health_port)
            assert w.server.reuse_port
            assert w.server.metrics_host == "127.0.0.1"
            assert w.server.metrics_port == plan.metrics_ports[i]
            assert w.server.cert_path == plan.cert_dir.name  # one pair for every worker
            assert w.peers.bind_host == "127.0.0.1"
            assert w.peers.port == plan.peer_ports[i]
            assert set(w.peers.peers) == {f"127.0.0.1:{p}" for j, p in enumerate(plan.peer_ports) if j != i}
        assert len({*plan.metrics_ports, *plan.peer_ports}) == 6
    finally:
        plan.close()
    assert not Path(plan.cert_dir.name).exists()


def test_plan_refuses_a_port_somebody_listens_on() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = Settings(server=ServerSettings(host="127.0.0.1", grpc_port=port, health_port=0))
        with pytest.raises(errors.ConfigError, match="--grpc-port"):
            serve.WorkerPlan.build(settings, 2)


def test_workers_flag() -> None:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    assert parser.parse_args([]).workers == 0
    assert parser.parse_args(["--workers", "4"]).workers == 4


def test_workers_batch_their_exchange_unless_told_otherwise() -> None:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    for argv, between_pods, between_workers in (
        ([], 0.002, serve.WORKER_FLUSH_INTERVAL_S),
        (["--peer-flush-interval", "3ms"], 0.003, 0.003),
    ):
        args = parser.parse_args(argv)
        settings, _ = app.load(args)
        assert settings.peers.flush_interval_s == between_pods
        assert serve.with_worker_flush(settings, args.peer_flush_interval).peers.flush_interval_s == between_workers
    assert serve.WORKER_FLUSH_INTERVAL_S == 0.005


# -- the merged page ----------------------------------------------------------------------------------------

_PAGE = """\
# HELP picker_requests_total Requests.
# TYPE picker_requests_total counter
picker_requests_total{{outcome="routed"}} {routed}
picker_requests_total{{outcome="shed"}} {shed}
# HELP picker_extproc_streams Open streams.
# TYPE picker_extproc_streams gauge
picker_extproc_streams {streams}
# HELP inference_pool_average_queue_size Mean queue.
# TYPE inference_pool_average_queue_size gauge
inference_pool_average_queue_size{{name="pool"}} {queue}
# HELP picker_decision_seconds Decisions.
# TYPE picker_decision_seconds histogram
picker_decision_seconds_bucket{{le="0.001"}} {fast}
picker_decision_seconds_bucket{{le="+Inf"}} {routed}
picker_decision_seconds_count {routed}
picker_decision_seconds_sum 0.5
"""


def test_merge_sums_events_and_own_work_but_not_pool_gauges() -> None:
    a = _PAGE.format(routed=10, shed=1, streams=3, queue=4.5, fast=7)
    b = _PAGE.format(routed=5, shed=0, streams=2, queue=4.0, fast=5)
    text = merge_pages([a, b]).decode()
    assert 'picker_requests_total{outcome="routed"} 15.0' in text
    assert 'picker_requests_total{outcome="shed"} 1.0' in text
    assert "picker_extproc_streams 5.0" in text  # each worker's own streams
    assert 'inference_pool_average_queue_size{name="pool"} 4.5' in text  # the pool's: the first worker's
    assert 'picker_decision_seconds_bucket{le="0.001"} 12.0' in text
    assert "picker_decision_seconds_count 15.0" in text
    assert "picker_decision_seconds_sum 1.0" in text
    assert "# TYPE picker_requests_total counter" in text
    assert merge_pages([]) == b""
    with pytest.raises(ValueError, match="not a Prometheus text page"):
        merge_pages(["this is { not a page"])


def test_merged_counters_never_drop_when_a_worker_restarts_or_misses_a_scrape() -> None:
    carry = CounterCarry()

    def merged(*pages: tuple[int, str], stale: tuple[int, ...] = ()) -> str:
        return merge_pages([p for _, p in pages], workers=[w for w, _ in pages], carry=carry, stale=stale).decode()

    def page(routed: int, streams: int, shed: int = 0) -> str:
        return _PAGE.format(routed=routed, shed=shed, streams=streams, queue=1, fast=0)

    routed, shed = 'picker_requests_total{outcome="routed"}', 'picker_requests_total{outcome="shed"}'
    assert gauge(merged((0, page(10, 1)), (1, page(5, 1, shed=3))), routed) == 15
    # Worker 1 does not answer: its last page stands in for its counts, not for its gauges.
    text = merged((0, page(14, 3)), (1, page(5, 7, shed=3)), stale=(1,))
    assert gauge(text, routed) == 14 + 5
    assert gauge(text, "picker_extproc_streams") == 3
    # Worker 1 is restarted: what it counted stays counted, also in a series it has not counted again yet.
    carry.restarted(1)
    text = merged((0, page(15, 1)), (1, page(2, 0).replace('{outcome="shed"} 0', '{outcome="other"} 0')))
    assert gauge(text, routed) == 15 + 5 + 2
    assert gauge(text, shed) == 3
    assert gauge(text, "picker_decision_seconds_count") == 15 + 5 + 2  # histograms too
    text = merged((0, page(16, 1)), (1, page(4, 0, shed=1)))
    assert (gauge(text, routed), gauge(text, shed)) == (16 + 5 + 4, 3 + 1)


# -- real processes -----------------------------------------------------------------------------------------

ENDPOINTS = 4
HELD = 12  # connections: all on one of two workers with probability 2 / 2**12


@contextlib.asynccontextmanager
async def metrics_stub(polls: Counter[str]) -> AsyncIterator[int]:
    page = (
        b'vllm:num_requests_waiting{model_name="m"} 0\nvllm:num_requests_running{model_name="m"} 0\n'
        b'vllm:kv_cache_usage_perc{model_name="m"} 0.1\n'
    )

    async def handle(request: web.Request) -> web.Response:
        polls[request.match_info["i"]] += 1
        return web.Response(body=page, content_type="text/plain")

    server = web.Application()
    server.router.add_get("/metrics/{i}", handle)
    runner = web.AppRunner(server, access_log=None)
    await runner.setup()
    [port] = procs.free_ports(1)
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def workers(
    tmp_path: Path, *extra: str, polls: Counter[str] | None = None
) -> AsyncIterator[tuple[procs.Child, int, int]]:
    """``polls``: counts the /metrics polls per endpoint index."""
    async with metrics_stub(polls if polls is not None else Counter()) as stub:
        endpoints = tmp_path / "endpoints.json"
        endpoints.write_text(
            json.dumps(
                [
                    {"address": f"10.9.0.{i}", "port": 8000, "metricsUrl": f"http://127.0.0.1:{stub}/metrics/{i}"}
                    for i in range(ENDPOINTS)
                ]
            )
        )
        grpc_port, health_port, metrics_port = procs.free_ports(3)
        argv = [
            *procs.picker_command(),
            "serve",
            "--workers=2",
            "--host=127.0.0.1",
            f"--grpc-port={grpc_port}",
            f"--grpc-health-port={health_port}",
            f"--metrics-port={metrics_port}",
            "--secure-serving=false",
            f"--endpoints-file={endpoints}",
            "--refresh-metrics-interval=100ms",
            "--grace-period=0.2s",
            "--termination-grace=2s",
            "--zap-encoder=console",
            *extra,
        ]
        async with procs.spawn("picker-workers", argv, stop_timeout_s=15) as child:
            yield child, grpc_port, metrics_port


async def scrape(metrics_port: int) -> str:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200
        return await resp.text()


def gauge(text: str, series: str) -> float | None:
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else None


def successes(text: str) -> float:
    """Scheduling successes, summed over every endpoint's series."""
    found = re.findall(
        r'^inference_extension_scheduler_attempts_total\{[^}]*status="success"[^}]*\} (\S+)$', text, re.M
    )
    return sum(float(v) for v in found)


async def until_page(metrics_port: int, series: str, value: float, child: procs.Child, timeout_s: float = 30) -> str:
    text = ""
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                child.check()
                with contextlib.suppress(aiohttp.ClientError, AssertionError):
                    text = await scrape(metrics_port)
                    if gauge(text, series) == value:
                        return text
                await asyncio.sleep(0.1)
    except TimeoutError:
        raise AssertionError(f"{series} never {value}:\n{text}\n{child.output()}") from None


async def hold(target: str, i: int) -> tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall, str]:  # type: ignore[type-arg]
    """A request routed on a connection of its own, whose stream stays open (so its lease stays held)."""
    channel = grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
    words = " ".join(f"w{i}x{j}" for j in range(40))  # no two prompts share a prefix
    body = orjson.dumps({"model": "m", "prompt": f"{i} {words}", "max_tokens": 8})
    headers = {":method": "POST", ":path": "/v1/completions", ":authority": "gw", "content-length": str(len(body))}
    call = pb_grpc.ExternalProcessorStub(channel).Process()
    for message in build_messages(headers, body):
        await call.write(message)
    while True:
        resp = await call.read()
        assert resp is not grpc.aio.EOF
        if resp.WhichOneof("response") == "request_headers":
            for opt in resp.request_headers.response.header_mutation.set_headers:
                if opt.header.key == "x-gateway-destination-endpoint":
                    return channel, call, opt.header.raw_value.decode()
            raise AssertionError("no destination")


def worker_pids(supervisor: int) -> list[int]:
    """The supervisor's worker processes (not multiprocessing's resource tracker)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parent = int((entry / "stat").read_text().rpartition(")")[2].split()[1])
                if parent == supervisor and b"resource_tracker" not in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
    return pids


def connected_pids(port: int, pids: list[int]) -> set[int]:
    """The pids among ``pids`` holding an established connection on local ``port`` (from /proc, no tools)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rpartition(":")[2], 16) == port and fields[3] == "01":  # ESTABLISHED
                    inodes.add(fields[9])
    holders = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        holders.add(pid)
    return holders


async def test_two_workers_share_the_port_and_schedule_as_one(tmp_path: Path) -> None:
    polls = Counter[str]()
    # picker-v1's token load counts every request in flight, the other worker's included: the shared ledger is what
    # is checked. (The default, the server model, weighs a request in flight by its share of the step, which these
    # backends, answering in the same time whatever runs, leave at the least.)
    pinned = f"--config-text={PREVIOUS_CONFIG_TEXT}"
    async with workers(tmp_path, pinned, polls=polls) as (child, grpc_port, metrics_port):
        await until_page(metrics_port, 'picker_workers{state="scraped"}', 2, child)
        await until_page(metrics_port, 'inference_pool_ready_pods{name="static"}', ENDPOINTS, child)
        await until_page(metrics_port, 'picker_peer_links{state="connected"}', 2, child)  # one link each way

        # Each server is polled once per interval for the pod, by one worker; the exchange tells the other.
        before = polls.copy()
        await asyncio.sleep(2.0)
        polled = [polls[str(i)] - before[str(i)] for i in range(ENDPOINTS)]
        assert all(5 <= n <= 30 for n in polled), polled  # every 100 ms: ~20 in 2 s (~40 if both polled)
        received = gauge(await scrape(metrics_port), 'picker_peer_scrapes_total{direction="received"}')
        assert received is not None
        assert received >= sum(polled) / 2
        pids = worker_pids(child.pid)
        assert len(pids) == 2
        held, counts = [], Counter[str]()
        try:
            for i in range(HELD):
                channel, call, destination = await hold(f"127.0.0.1:{grpc_port}", i)
                held.append((channel, call))
                # Every request goes to a least loaded endpoint, counting the requests the *other* worker holds:
                # the workers' in-flight ledgers are shared over the peer exchange.
                least = min((counts[f"10.9.0.{e}:8000"] for e in range(ENDPOINTS)), default=0)
                assert counts[destination] == least, (i, destination, dict(counts))
                counts[destination] += 1
                await asyncio.sleep(0.1)  # longer than the exchange's flush interval
            assert connected_pids(grpc_port, pids) == set(pids)  # both workers serve this port
            text = await scrape(metrics_port)
            assert gauge(text, "picker_extproc_streams") == HELD  # summed over the workers
        finally:
            for channel, call in held:
                call.cancel()
                await channel.close()

        # A worker that dies is replaced; the pod keeps serving on the same port meanwhile, and the pod's counters
        # keep what the dead worker had counted.
        assert successes(await scrape(metrics_port)) == HELD
        os.kill(pids[0], signal.SIGKILL)
        await until_page(metrics_port, "picker_worker_restarts", 1, child)
        await until_page(metrics_port, 'picker_workers{state="scraped"}', 2, child)
        channel, call, destination = await hold(f"127.0.0.1:{grpc_port}", 99)
        assert destination.startswith("10.9.0.")
        assert successes(await scrape(metrics_port)) == HELD + 1
        call.cancel()
        await channel.close()
        assert len(worker_pids(child.pid)) == 2

        # SIGTERM: passed on, both drain, exit 0; nothing is left holding the port.
        new_pids = worker_pids(child.pid)
        assert await child.stop(timeout_s=15) == 0
        assert not any(alive(pid) for pid in new_pids)


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


async def test_a_configuration_error_in_the_workers_stops_the_supervisor(tmp_path: Path) -> None:
    text = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\nplugins: [{type: no-such}]"
    async with workers(tmp_path, f"--config-text={text}") as (child, _, _):
        async with asyncio.timeout(60):
            code = await child.proc.wait()
        child.stopping = True
        assert code == 2
        assert "no-such" in child.output()  # the worker's message


def test_explicit_workers_with_leader_election_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    args = parser.parse_args(["--workers=2", "--pool-name=p", "--ha-enable-leader-election"])
    assert serve.run(args) == 2
    assert "does not combine with leader election" in capsys.readouterr().err


def test_one_worker_is_the_plain_picker() -> None:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    settings, kube = app.load(parser.parse_args(["--endpoints=10.0.0.1:8000"]))
    assert serve.worker_count(parser.parse_args([]).workers, settings, kube, limit=None) == 1


def test_a_taken_metrics_port_fails_the_start_before_any_worker(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    parser = argparse.ArgumentParser()
    serve.configure(parser)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = parser.parse_args(
            ["--workers=2", "--host=127.0.0.1", "--grpc-port=0", "--grpc-health-port=0", f"--metrics-port={port}"]
        )
        root = logging.getLogger()
        saved = (list(root.handlers), root.level)
        try:
            assert serve.run(args) == 2
        finally:
            root.handlers[:] = saved[0]
            root.setLevel(saved[1])
    assert not worker_pids(os.getpid())  # none was started
    assert f"cannot listen on 127.0.0.1:{port} (--metrics-port)" in capsys.readouterr().err
