"""``picker bench overhead``: picker's cost per request over real gRPC, beside a do-nothing ext_proc server.

Each configuration starts a fresh server process (``picker serve`` in plaintext, or the do-nothing
``picker.bench.nullproc``) and drives it like Envoy does: a new stream per HTTP request, request headers and
the body in ≤ 64 KiB chunks. Two passes per configuration:

* latency: one request at a time — p50/p99 of the *decision* (last body byte sent → headers response received);
* throughput: ``--concurrency`` streams for ``--duration`` seconds — completed requests per second, over
  ``--connections`` TCP connections (several, so that picker's ``--workers`` each get some: the kernel spreads
  connections, not streams, over them). The client is ``tools/extproc-load`` (``--client go``, the default; Go,
  built by ``scripts/install-tools.sh``) or this package's Python client (``--client python``, from
  ``--client-procs`` processes). The Python client spends about as much CPU per request as the server it measures,
  so on a small machine it takes the cores the server would use; Envoy, the real client, is compiled, and so is
  the Go one (its CPU per request is a column of the table).

``--repeat N`` measures every configuration N times in rounds (each round: the do-nothing server, then every
picker configuration, each a fresh process). The table shows medians, and "vs null" is the median of the ratios
taken within each round, so a neighbour's burst on a shared machine moves one round's pair, not the figure.

By default the requests take 32 prompts in turn, which picker's prefix index learns once; ``--fresh`` gives every
request a prompt of its own (a number at its start), as new conversations are: the index then learns every
request's blocks, and evicts once full.

``--workers 1,2`` measures picker with each worker count, and the do-nothing server with as many processes on
its port: what a second process adds to gRPC's own cost, the ceiling for picker's. On a machine where the client
shares the cores with the server (this VM: 2 cores), more workers cannot show more than the cores left over; the
table says so.

The figure that matters is picker's rate as a share of the do-nothing rate measured in the same run (the machine
is shared and noisy; absolute numbers move, ratios much less). Model-server metrics come from one local stub page
per endpoint, polled every ``--scrape-interval`` (scraping is a background cost measured separately).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from picker.bench import flags, procs
from picker.bench.extproc_client import ExtProcClient, build_messages
from picker.scheduling import units

__all__ = ["ClientNotFound", "Row", "Summary", "configure", "go_client", "prompt_bodies", "run", "summarize"]

_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "chi",
    "psi",
    "omega",
    "model",
    "token",
    "cache",
    "prefix",
    "queue",
    "server",
    "request",
    "answer",
]


@dataclass(frozen=True, slots=True)
class Row:
    server: str  # "picker" (the native front), "picker/grpc", "do-nothing" (grpc.aio) or "do-nothing/native"
    workers: int  # picker's --workers; the do-nothing server's processes on the one port
    endpoints: int
    prompt_bytes: int
    rps: float
    decision_p50_ms: float
    decision_p99_ms: float
    errors: int
    cpu_ms_per_request: float  # the server's CPU (every process of it) over the throughput pass, per request
    client_cpu_ms_per_request: float = 0.0  # the load client's CPU over the throughput pass, per request
    round: int = 0  # --repeat: which round measured it


@dataclass(frozen=True, slots=True)
class Summary:
    """One configuration over every round: medians, and the do-nothing ratio taken within each round."""

    server: str
    workers: int
    endpoints: int
    prompt_bytes: int
    rounds: int
    rps: float
    vs_null: float | None  # median over rounds of rps / the same round's do-nothing rps (one process; else None)
    vs_null_range: tuple[float, float] | None
    cost_vs_least: float | None  # median over rounds of (rps at the fewest endpoints, same workers) / rps
    vs_one_worker: float | None  # median over rounds of rps / (rps with one worker, same endpoints); None at 1
    decision_p50_ms: float
    decision_p99_ms: float
    cpu_ms_per_request: float
    client_cpu_ms_per_request: float
    errors: int


GO_CLIENT = "extproc-load"


class ClientNotFound(RuntimeError):
    pass


def go_client() -> str:
    """The Go load client's path (``tools/extproc-load``, built by ``scripts/install-tools.sh``)."""
    found = procs.tool_binary(GO_CLIENT)
    if found is not None:
        return found
    raise ClientNotFound(
        f"the Go load client is not built: run scripts/install-tools.sh (go build tools/{GO_CLIENT}), "
        "or pass --client python"
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoints", default="16,256", help="endpoint counts to test (comma list)")
    parser.add_argument("--sizes", default="4096,225280", help="prompt sizes in bytes (comma list)")
    parser.add_argument("--workers", default="1", help="picker --workers counts to test (comma list)")
    parser.add_argument(
        "--concurrency", type=units.at_least(1), default=64, help="concurrent streams in the throughput pass"
    )
    parser.add_argument(
        "--connections", type=units.at_least(1), default=8, help="TCP connections in the throughput pass"
    )
    parser.add_argument(
        "--client",
        choices=("go", "python"),
        default="go",
        help="the throughput pass's load client: tools/extproc-load (go) or picker's Python client",
    )
    parser.add_argument(
        "--client-procs",
        type=units.at_least(1),
        default=1,
        help="--client python: client processes in the throughput pass",
    )
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="a prompt of its own for every request (new to picker's prefix index); needs --client go",
    )
    parser.add_argument(
        "--repeat", type=units.at_least(1), default=1, help="rounds of every configuration (medians shown)"
    )
    parser.add_argument("--duration", type=units.above(0), default=5.0, help="seconds of the throughput pass")
    parser.add_argument(
        "--latency-requests", type=units.at_least(2), default=300, help="sequential requests, latency pass"
    )
    parser.add_argument(
        "--scrape-interval", type=_go_duration, default="1s", help="picker's --refresh-metrics-interval"
    )
    parser.add_argument("--staleness", type=_go_duration, default="2s", help="picker's --metrics-staleness-threshold")
    parser.add_argument(
        "--prefilter",
        type=units.at_least(0),
        default=None,
        help="picker's --prefilter-endpoints (default: picker's default)",
    )
    parser.add_argument(
        "--picker-args", default="", metavar="ARGS", help="more `picker serve` flags, one string (shell words)"
    )
    parser.add_argument(
        "--fronts",
        default="native",
        help="ext_proc fronts to measure (comma list of native, grpc): picker with --grpc-frontend each, and with "
        "native the do-nothing server on the native front too; the reference stays the grpc.aio do-nothing server",
    )
    parser.add_argument("--json", dest="json_path", default=None, help="write the rows as JSON here")
    parser.add_argument("--png", default=None, help="write a bar chart here (needs matplotlib)")


def _go_duration(text: str) -> str:
    """A duration flag handed on to ``picker serve`` as written, once it reads as one (a usage error here, not a
    server that exits at start)."""
    units.duration_arg(text)
    return text


def run(args: argparse.Namespace) -> int:
    try:
        plan = _Plan(
            counts=flags.numbers(args.endpoints, "--endpoints", int, least=1),
            sizes=flags.numbers(args.sizes, "--sizes", int, least=1),
            worker_counts=flags.numbers(args.workers, "--workers", int, least=1),
            fronts=flags.names(args.fronts),
        )
        if not plan.fronts or not set(plan.fronts) <= _FRONTS:
            raise ValueError(f"--fronts {args.fronts!r}: a comma list of {', '.join(sorted(_FRONTS))}")
    except ValueError as exc:
        print(f"picker bench overhead: {exc}", file=sys.stderr)
        return 2
    if args.fresh and args.client != "go":
        print("picker bench overhead: --fresh needs --client go", file=sys.stderr)
        return 2
    if args.client == "go":
        try:
            args.go_client = go_client()
        except ClientNotFound as exc:
            print(f"picker bench overhead: {exc}", file=sys.stderr)
            return 2
    rows = asyncio.run(_main(plan, args))
    summaries = summarize(rows)
    print(f"throughput client: {args.client}; {max(1, args.repeat)} round(s), medians")
    _print_table(summaries)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps([asdict(r) for r in rows], indent=2))
    if args.png:
        _plot(summaries, args.png)
    return 0


@dataclass(frozen=True)
class _Plan:
    """What to measure: the flags' comma lists, parsed."""

    counts: list[int]  # endpoints
    sizes: list[int]  # prompt bytes
    worker_counts: list[int]
    fronts: list[str]


_FRONTS = frozenset({"native", "grpc"})


async def _main(plan: _Plan, args: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    async with _metrics_stub(max(plan.counts)) as metrics_port:
        for round_ in range(max(1, args.repeat)):
            for size in plan.sizes:
                rows.extend(await _size_round(round_, size, plan, metrics_port, args))
    return rows


async def _size_round(round_: int, size: int, plan: _Plan, metrics_port: int, args: argparse.Namespace) -> list[Row]:
    """One round at one prompt size: the do-nothing server (as many processes as each worker count), then every
    picker configuration."""
    rows: list[Row] = []
    bodies = prompt_bodies(size)
    counts, worker_counts, fronts = plan.counts, plan.worker_counts, plan.fronts
    nulls: list[tuple[str, list[str]]] = [("do-nothing", [])] + (
        [("do-nothing/native", ["--native"])] if "native" in fronts else []
    )
    for name, null_flags in nulls:
        for processes in worker_counts:
            cmd = [sys.executable, "-m", "picker.bench.nullproc", "{port}", str(processes), *null_flags]
            async with _server(cmd, settle_s=0.5 if processes == 1 else 2.0) as served:  # others: spawn, import
                rows.append(await _measure(name, processes, 0, size, served, bodies, args, round_))
    for count in counts:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(
                [
                    {
                        "address": f"10.{i // 250}.{i % 250}.1",
                        "port": 8000,
                        "metricsUrl": f"http://127.0.0.1:{metrics_port}/metrics/{i}",
                    }
                    for i in range(count)
                ],
                f,
            )
        cmd = [
            sys.executable,
            "-m",
            "picker.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--grpc-port",
            "{port}",
            "--grpc-health-port",
            "0",
            "--metrics-port",
            "0",
            "--secure-serving=false",
            "--endpoints-file",
            f.name,
            "--refresh-metrics-interval",
            args.scrape_interval,
            "--metrics-staleness-threshold",
            args.staleness,
            "--grace-period",  # stopped when its run ends: no gateway is there to notice a drain
            "0s",
        ]
        if args.prefilter is not None:
            cmd += ["--prefilter-endpoints", str(args.prefilter)]
        cmd += shlex.split(args.picker_args)
        try:
            for front in fronts:
                name = "picker" if front == "native" else f"picker/{front}"
                for workers in worker_counts:
                    settle_s = 1.0 + count / 200 + (2.0 if workers > 1 else 0.0)  # workers: spawn, peer links
                    picker_cmd = [*cmd, "--workers", str(workers), "--grpc-frontend", front]
                    async with _server(picker_cmd, settle_s=settle_s) as served:
                        rows.append(await _measure(name, workers, count, size, served, bodies, args, round_))
        finally:
            os.unlink(f.name)
    return rows


def prompt_bodies(size: int, n: int = 32) -> list[bytes]:
    """``n`` streamed completions bodies of about ``size`` bytes, seeded by the size (the benchmarks' prompts)."""
    rng = random.Random(size)
    bodies = []
    for _ in range(n):
        words: list[str] = []
        length = 0
        while length < size - 80:
            w = rng.choice(_WORDS)
            words.append(w)
            length += len(w) + 1
        bodies.append(orjson.dumps({"model": "m", "prompt": " ".join(words), "max_tokens": 64, "stream": True}))
    return bodies


def fresh_prompt_bodies(size: int, n: int) -> list[bytes]:
    """``n`` bodies like ``prompt_bodies(size)``, each prompt beginning with its own number: no two share a block
    (a block's hash chains every block before it), so each is new to a prefix index, as new conversations are."""
    base = prompt_bodies(size)
    return [base[i % len(base)].replace(b'"prompt":"', b'"prompt":"%d ' % i, 1) for i in range(n)]


_HEADERS = {
    ":method": "POST",
    ":path": "/v1/completions",
    ":authority": "gateway",
    ":scheme": "http",
    "content-type": "application/json",
    "user-agent": "bench",
    "accept": "*/*",
}


def _messages(bodies: list[bytes]) -> list[list[pb.ProcessingRequest]]:
    return [build_messages({**_HEADERS, "content-length": str(len(b))}, b) for b in bodies]


async def _measure(
    server: str,
    workers: int,
    count: int,
    size: int,
    served: tuple[int, int],
    bodies: list[bytes],
    args: argparse.Namespace,
    round_: int = 0,
) -> Row:
    port, pid = served
    messages = _messages(fresh_prompt_bodies(size, 20 + args.latency_requests) if args.fresh else bodies)
    client = ExtProcClient(f"127.0.0.1:{port}")
    errors = 0
    try:
        for i in range(20):  # warm-up
            await client.exchange(messages[i % len(messages)])
        decisions: list[float] = []
        for i in range(args.latency_requests):
            ex = await client.exchange(messages[i % len(messages)])
            errors += ex.status != 200
            decisions.append(ex.decision_s)
    finally:
        await client.close()
    go = args.client == "go"
    cpu_before, client_before = _tree_cpu_s(pid), _client_cpu_s(go=go)
    if go:
        done, failed, elapsed = await _drive_go(args.go_client, port, bodies, args)
    else:
        done, failed, elapsed = await _drive_python(port, size, args)
    cpu_ms = (_tree_cpu_s(pid) - cpu_before) * 1000 / max(1, done)
    client_ms = (_client_cpu_s(go=go) - client_before) * 1000 / max(1, done)
    q = statistics.quantiles(decisions, n=100, method="inclusive")
    return Row(
        server,
        workers,
        count,
        size,
        done / elapsed,
        q[49] * 1000,
        q[98] * 1000,
        errors + failed,
        cpu_ms,
        client_ms,
        round_,
    )


async def _drive_python(port: int, size: int, args: argparse.Namespace) -> tuple[int, int, float]:
    procs_n = max(1, args.client_procs)
    share = _Share(port, size, args.duration, max(1, args.concurrency // procs_n), max(1, args.connections // procs_n))
    if procs_n == 1:
        return await _drive(share)
    loop = asyncio.get_running_loop()
    with ProcessPoolExecutor(procs_n, mp_context=multiprocessing.get_context("spawn")) as pool:
        start_at = time.time() + 2.0  # after every process has started and connected
        parts = await asyncio.gather(
            *(loop.run_in_executor(pool, _drive_in_process, share, start_at) for _ in range(procs_n))
        )
    return sum(p[0] for p in parts), sum(p[1] for p in parts), max(p[2] for p in parts)


async def _drive_go(binary: str, port: int, bodies: list[bytes], args: argparse.Namespace) -> tuple[int, int, float]:
    """The throughput pass by ``tools/extproc-load``: (completed, failed, seconds)."""
    with tempfile.NamedTemporaryFile("wb", suffix=".bodies") as f:
        f.write(b"\n".join(bodies) + b"\n")  # JSON bodies hold no raw newline
        f.flush()
        proc = await asyncio.create_subprocess_exec(
            binary,
            "-target",
            f"127.0.0.1:{port}",
            "-bodies",
            f.name,
            "-mode",
            "throughput",
            "-duration",
            f"{args.duration}s",
            "-concurrency",
            str(args.concurrency),
            "-connections",
            str(args.connections),
            *(["-fresh"] if args.fresh else []),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{GO_CLIENT} failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    result = json.loads(out)
    return int(result["completed"]), int(result["failed"]), float(result["elapsed_s"])


def _client_cpu_s(*, go: bool) -> float:
    """CPU seconds of the load client so far: the reaped children's (the Go client) or, for the Python client,
    this process's and its reaped children's (--client-procs). The Python figure includes the metrics stub, which
    serves the scrapes from this process (1,024 polls a second at 1,024 endpoints)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = children.ru_utime + children.ru_stime
    return reaped if go else time.process_time() + reaped


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its children (a ``--workers`` supervisor's)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {pid}, True
    while grew:
        more = {p for p, parent in parents.items() if parent in tree} - tree
        grew = bool(more)
        tree |= more
    return sum(times.get(p, 0.0) for p in tree)


@dataclass(frozen=True, slots=True)
class _Share:
    """One client process's part of the throughput pass."""

    port: int
    size: int
    duration_s: float
    concurrency: int
    connections: int


def _drive_in_process(share: _Share, start_at: float) -> tuple[int, int, float]:
    return asyncio.run(_drive(share, start_at))


async def _drive(share: _Share, start_at: float | None = None) -> tuple[int, int, float]:
    """``share.concurrency`` streams in a loop over ``share.connections`` connections for ``share.duration_s``:
    (completed, failed, seconds)."""
    messages = _messages(prompt_bodies(share.size))
    clients = [ExtProcClient(f"127.0.0.1:{share.port}", own_connection=True) for _ in range(share.connections)]
    done = failed = 0
    try:
        for c in clients:  # connect (and warm) every connection before the clock starts
            await c.exchange(messages[0])
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        deadline = time.perf_counter() + share.duration_s

        async def stream_loop(w: int) -> None:
            nonlocal done, failed
            client, i = clients[w % len(clients)], w
            while time.perf_counter() < deadline:
                ex = await client.exchange(messages[i % len(messages)])
                failed += ex.status != 200
                done += 1
                i += share.concurrency

        started = time.perf_counter()
        await asyncio.gather(*(stream_loop(w) for w in range(share.concurrency)))
        return done, failed, time.perf_counter() - started
    finally:
        for c in clients:
            await c.close()


@contextlib.asynccontextmanager
async def _server(cmd: list[str], settle_s: float = 0.5) -> AsyncIterator[tuple[int, int]]:
    """The server's (port, pid)."""
    port = _free_port()
    argv = [c.replace("{port}", str(port)) for c in cmd]
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            await _wait_port(port, proc)
            await asyncio.sleep(settle_s)  # first scrapes land
            yield port, proc.pid
        except BaseException:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:].decode(errors="replace"))
            raise
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    await asyncio.wait_for(proc.wait(), 10)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


@contextlib.asynccontextmanager
async def _metrics_stub(count: int) -> AsyncIterator[int]:
    """One small vLLM-style page per endpoint, with distinct queue/KV numbers."""
    pages = [
        (
            f'vllm:num_requests_waiting{{model_name="m"}} {i % 7}\n'
            f'vllm:num_requests_running{{model_name="m"}} {i % 5}\n'
            f'vllm:kv_cache_usage_perc{{model_name="m"}} {(i % 10) / 10}\n'
        ).encode()
        for i in range(count)
    ]

    async def handle(request: web.Request) -> web.Response:
        return web.Response(body=pages[int(request.match_info["i"])], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics/{i}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


def _free_port() -> int:
    return procs.free_port()


async def _wait_port(port: int, proc: asyncio.subprocess.Process, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise TimeoutError(f"port {port} did not open within {timeout_s}s")


def summarize(rows: list[Row]) -> list[Summary]:
    """One summary per configuration, in first-measured order: medians over rounds. Every ratio is taken within
    each round (the two rates measured minutes apart at most, on the same state of a shared machine), then its
    median: against the do-nothing server, against the fewest endpoints, against one worker."""
    rate = {
        (r.round, r.server, r.workers, r.endpoints if _is_picker(r.server) else 0, r.prompt_bytes): r.rps for r in rows
    }
    least = min((r.endpoints for r in rows if _is_picker(r.server)), default=0)
    groups: dict[tuple[str, int, int, int], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.server, r.workers, r.endpoints, r.prompt_bytes), []).append(r)

    def ratios(group: list[Row], reference: tuple[str, int, int, int], *, inverse: bool = False) -> list[float]:
        out = []
        for r in group:
            ref = rate.get((r.round, *reference))
            if ref and r.rps:
                out.append(ref / r.rps if inverse else r.rps / ref)
        return out

    out = []
    for (server, workers, endpoints, size), group in groups.items():
        picker = _is_picker(server)
        # Against one grpc.aio do-nothing process (the goal's measure); for every other server too.
        vs_null = ratios(group, ("do-nothing", 1, 0, size)) if (server, workers) != ("do-nothing", 1) else []
        cost = ratios(group, (server, workers, least, size), inverse=True) if picker else []
        vs_one = ratios(group, (server, 1, endpoints if picker else 0, size)) if workers > 1 else []
        out.append(
            Summary(
                server=server,
                workers=workers,
                endpoints=endpoints,
                prompt_bytes=size,
                rounds=len(group),
                rps=statistics.median(r.rps for r in group),
                vs_null=statistics.median(vs_null) if vs_null else None,
                vs_null_range=(min(vs_null), max(vs_null)) if vs_null else None,
                cost_vs_least=statistics.median(cost) if cost else None,
                vs_one_worker=statistics.median(vs_one) if vs_one else None,
                decision_p50_ms=statistics.median(r.decision_p50_ms for r in group),
                decision_p99_ms=statistics.median(r.decision_p99_ms for r in group),
                cpu_ms_per_request=statistics.median(r.cpu_ms_per_request for r in group),
                client_cpu_ms_per_request=statistics.median(r.client_cpu_ms_per_request for r in group),
                errors=sum(r.errors for r in group),
            )
        )
    return out


def _is_picker(server: str) -> bool:
    return server.startswith("picker")


def _print_table(rows: list[Summary]) -> None:
    head = (
        f"{'server':<18}{'workers':>8}{'endpoints':>10}{'prompt':>10}{'req/s':>9}{'vs null':>9}{'(range)':>12}"
        f"{'cost vs min eps':>16}{'vs 1 worker':>12}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms/req':>11}{'client':>8}"
        f"{'errors':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        picker = _is_picker(r.server)
        share = f"{r.vs_null:.0%}" if r.vs_null is not None else ""
        spread = (
            f"{r.vs_null_range[0]:.0%}-{r.vs_null_range[1]:.0%}" if r.vs_null_range is not None and r.rounds > 1 else ""
        )
        cost = f"{r.cost_vs_least:.2f}x" if r.cost_vs_least is not None else ""
        scale = f"{r.vs_one_worker:.2f}x" if r.vs_one_worker is not None else ""
        eps = str(r.endpoints) if picker else "-"
        print(
            f"{r.server:<18}{r.workers:>8}{eps:>10}{_size(r.prompt_bytes):>10}{r.rps:>9.0f}{share:>9}{spread:>12}"
            f"{cost:>16}{scale:>12}{r.decision_p50_ms:>9.2f}{r.decision_p99_ms:>9.2f}{r.cpu_ms_per_request:>11.2f}"
            f"{r.client_cpu_ms_per_request:>8.2f}{r.errors:>8}"
        )
    cores = len(os.sched_getaffinity(0))
    if any(r.workers > 1 for r in rows):
        print(f"{cores} cores here, shared by the client and the server: workers beyond the cores the client leaves")
        print("cannot add throughput on this machine; CPU ms/req says what a request costs wherever it runs.")


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 else f"{n} B"


def _plot(rows: list[Summary], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        f"{r.server if r.server != 'picker' and r.workers == 1 else f'{r.server} x{r.workers}'} {r.endpoints or ''} "
        f"{_size(r.prompt_bytes)}"
        for r in rows
    ]

    def color(r: Summary) -> str:
        if not _is_picker(r.server):
            return "#888"
        if r.server != "picker":
            return "#b9b"  # picker on another front
        return "#2a7" if r.workers == 1 else "#17a"

    colors = [color(r) for r in rows]
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5.5))
    # The rate as a share of the do-nothing server's in the same round: absolute rates move with the machine.
    ax1.bar(labels, [100 * r.vs_null if r.vs_null is not None else 100 for r in rows], color=colors)
    ax1.axhline(90, color="#c63", linestyle="--", linewidth=1, label="issue 13 goal (one worker, 16 endpoints)")
    ax1.set_ylabel("rate, % of the grpc.aio do-nothing server's (median of rounds)")
    ax1.legend(fontsize=8)
    ax2.bar(labels, [r.decision_p99_ms for r in rows], color="#c63", label="p99")
    ax2.bar(labels, [r.decision_p50_ms for r in rows], color="#27a", label="p50")
    ax2.set_ylabel("decision latency, ms")
    ax2.legend()
    ax3.bar(labels, [r.cpu_ms_per_request for r in rows], color=colors)
    ax3.set_ylabel("server CPU per request, ms (all processes)")
    for ax in (ax1, ax2, ax3):
        ax.tick_params(axis="x", labelsize=7, labelrotation=60)
    fig.suptitle("picker (x workers, endpoints, prompt) vs a do-nothing ext_proc server")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
