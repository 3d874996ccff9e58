"""``picker bench overhead``: picker's cost per request over real gRPC, beside a do-nothing ext_proc server.

Each configuration starts a fresh server process (``picker serve`` in plaintext, or the do-nothing
``picker.bench.nullproc``) and drives it like Envoy does: a new stream per HTTP request, request headers and
the body in ≤ 64 KiB chunks. Two passes per configuration:

* latency: one request at a time — p50/p99 of the *decision* (last body byte sent → headers response received);
* throughput: ``--concurrency`` workers for ``--duration`` seconds — completed requests per second.

The figure that matters is picker's rate as a share of the do-nothing rate measured in the same run (the machine
is shared and noisy; absolute numbers move, ratios much less). Model-server metrics come from one local stub page
per endpoint, polled every ``--scrape-interval`` (scraping is a background cost measured separately).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson
from aiohttp import web

from picker.bench import procs
from picker.bench.extproc_client import ExtProcClient, build_messages

__all__ = ["configure", "prompt_bodies", "run"]

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
    server: str  # "picker" or "do-nothing"
    endpoints: int
    prompt_bytes: int
    rps: float
    decision_p50_ms: float
    decision_p99_ms: float
    errors: int


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoints", default="16,256", help="endpoint counts to test (comma list)")
    parser.add_argument("--sizes", default="4096,225280", help="prompt sizes in bytes (comma list)")
    parser.add_argument("--concurrency", type=int, default=64, help="workers in the throughput pass")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of the throughput pass")
    parser.add_argument("--latency-requests", type=int, default=300, help="sequential requests, latency pass")
    parser.add_argument("--scrape-interval", default="1s", help="picker's --refresh-metrics-interval")
    parser.add_argument("--staleness", default="2s", help="picker's --metrics-staleness-threshold")
    parser.add_argument(
        "--prefilter", type=int, default=None, help="picker's --prefilter-endpoints (default: picker's default)"
    )
    parser.add_argument("--json", dest="json_path", default=None, help="write the rows as JSON here")
    parser.add_argument("--png", default=None, help="write a bar chart here (needs matplotlib)")


def run(args: argparse.Namespace) -> int:
    rows = asyncio.run(_main(args))
    _print_table(rows)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps([asdict(r) for r in rows], indent=2))
    if args.png:
        _plot(rows, args.png)
    return 0


async def _main(args: argparse.Namespace) -> list[Row]:
    counts = [int(x) for x in args.endpoints.split(",")]
    sizes = [int(x) for x in args.sizes.split(",")]
    rows: list[Row] = []
    async with _metrics_stub(max(counts)) as metrics_port:
        for size in sizes:
            bodies = prompt_bodies(size)
            async with _server([sys.executable, "-m", "picker.bench.nullproc", "{port}"]) as port:
                rows.append(await _measure("do-nothing", 0, size, port, bodies, args))
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
                ]
                if args.prefilter is not None:
                    cmd += ["--prefilter-endpoints", str(args.prefilter)]
                try:
                    async with _server(cmd, settle_s=1.0 + count / 200) as port:
                        rows.append(await _measure("picker", count, size, port, bodies, args))
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


async def _measure(server: str, count: int, size: int, port: int, bodies: list[bytes], args: argparse.Namespace) -> Row:
    headers = {
        ":method": "POST",
        ":path": "/v1/completions",
        ":authority": "gateway",
        ":scheme": "http",
        "content-type": "application/json",
        "user-agent": "bench",
        "accept": "*/*",
    }
    messages = [build_messages({**headers, "content-length": str(len(b))}, b) for b in bodies]
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
        done = 0
        deadline = time.perf_counter() + args.duration

        async def worker(w: int) -> None:
            nonlocal done, errors
            i = w
            while time.perf_counter() < deadline:
                ex = await client.exchange(messages[i % len(messages)])
                errors += ex.status != 200
                done += 1
                i += args.concurrency

        started = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(args.concurrency)))
        rps = done / (time.perf_counter() - started)
    finally:
        await client.close()
    q = statistics.quantiles(decisions, n=100, method="inclusive")
    return Row(server, count, size, rps, q[49] * 1000, q[98] * 1000, errors)


@contextlib.asynccontextmanager
async def _server(cmd: list[str], settle_s: float = 0.5) -> AsyncIterator[int]:
    port = _free_port()
    argv = [c.replace("{port}", str(port)) for c in cmd]
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            await _wait_port(port, proc)
            await asyncio.sleep(settle_s)  # first scrapes land
            yield port
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


def _print_table(rows: list[Row]) -> None:
    null = {r.prompt_bytes: r.rps for r in rows if r.server == "do-nothing"}
    base16 = {
        r.prompt_bytes: r.rps
        for r in rows
        if r.server == "picker" and r.endpoints == min((x.endpoints for x in rows if x.server == "picker"), default=0)
    }
    head = (
        f"{'server':<11}{'endpoints':>10}{'prompt':>10}{'req/s':>9}{'vs null':>9}{'cost vs min eps':>16}"
        f"{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        share = f"{r.rps / null[r.prompt_bytes]:.0%}" if r.server == "picker" and null.get(r.prompt_bytes) else ""
        cost = f"{base16[r.prompt_bytes] / r.rps:.2f}x" if r.server == "picker" and base16.get(r.prompt_bytes) else ""
        eps = str(r.endpoints) if r.server == "picker" else "-"
        print(
            f"{r.server:<11}{eps:>10}{_size(r.prompt_bytes):>10}{r.rps:>9.0f}{share:>9}{cost:>16}"
            f"{r.decision_p50_ms:>9.2f}{r.decision_p99_ms:>9.2f}{r.errors:>8}"
        )


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 else f"{n} B"


def _plot(rows: list[Row], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.server}\n{r.endpoints or '-'} eps\n{_size(r.prompt_bytes)}" for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax1.bar(labels, [r.rps for r in rows], color=["#888" if r.server != "picker" else "#2a7" for r in rows])
    ax1.set_ylabel("requests/s (new stream per request)")
    ax2.bar(labels, [r.decision_p99_ms for r in rows], color="#c63", label="p99")
    ax2.bar(labels, [r.decision_p50_ms for r in rows], color="#27a", label="p50")
    ax2.set_ylabel("decision latency, ms")
    ax2.legend()
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=7)
    fig.suptitle("picker overhead vs a do-nothing ext_proc server")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
