"""``picker bench schedule``: the in-process cost of one scheduling cycle, without gRPC.

Runs the production ``Scheduler`` (picker's default configuration, or ``--config FILE``) on parsed requests
against N endpoints with varied scraped metrics, including ``pre_request`` (the prefix index learning the pick), and
prints µs per cycle (median of ``--repeat`` timings); ``--prefilter`` as ``picker serve --prefilter-endpoints``.
The part of picker's per-request cost that grows with the endpoint count and the prompt length; ``picker bench
overhead`` measures the whole request over real gRPC.

``--fresh``: every request's prompt is one the index has never seen (new conversations, which the index must
learn and, once full, evict for), instead of 32 prompts in turn that it learns once.

``--peers``: the cycle as in a replica with active-active peers (or one of ``--workers N``): a peer reports
requests and tokens in flight on every endpoint, so every load read counts picker's own and the peers'.

``--whole-path`` adds a column: the whole request in process, as the servicer runs it for the overhead
benchmark's messages (request headers, then the body with end_of_stream; then the stream's close): parsing,
admission, scheduling, the in-flight lease, metrics and the answers, without gRPC. Over gRPC, picker costs the
do-nothing server's CPU per request plus about this path (docs/performance.md), so this column is the figure to
drive down.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import time
from pathlib import Path

from picker.bench import flags
from picker.bench import path as whole_path
from picker.bench.overhead import fresh_prompt_bodies, prompt_bodies
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.endpoints.peerload import PeerLoads
from picker.request.parse import parse_request
from picker.scheduling import units
from picker.scheduling.config import load_config
from picker.scheduling.framework import PluginContext
from picker.scheduling.scheduler import Scheduler
from picker.settings import Settings

__all__ = ["bench_endpoints", "configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoints", default="16,256", help="endpoint counts (comma list)")
    parser.add_argument("--sizes", default="4096,225280", help="prompt sizes in bytes (comma list)")
    parser.add_argument("--cycles", type=units.at_least(1), default=2000, help="cycles per timing")
    parser.add_argument(
        "--repeat", type=units.at_least(1), default=5, help="timings per configuration (the median is shown)"
    )
    parser.add_argument(
        "--prefilter",
        type=units.at_least(0),
        default=Settings().prefilter_endpoints,
        help="--prefilter-endpoints of the scheduler (0: off; default: picker serve's)",
    )
    parser.add_argument("--config", default=None, help="EndpointPickerConfig file (default: picker's default)")
    parser.add_argument(
        "--whole-path", action="store_true", help="also time the whole request path in process (no gRPC)"
    )
    parser.add_argument("--fresh", action="store_true", help="a prompt the prefix index has not seen for every request")
    parser.add_argument(
        "--peers", action="store_true", help="a peer replica's load on every endpoint (the cycle; not --whole-path)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        counts = flags.numbers(args.endpoints, "--endpoints", int, least=1)
        sizes = flags.numbers(args.sizes, "--sizes", int, least=1)
    except ValueError as exc:
        print(f"picker bench schedule: {exc}", file=sys.stderr)
        return 2
    config_text = Path(args.config).read_text() if args.config else None
    print(
        f"{'endpoints':>10}{'prompt':>10}{'us/cycle':>10}" + (f"{'whole path us/req':>19}" if args.whole_path else "")
    )
    for count in counts:
        for size in sizes:
            line = f"{count:>10}{size // 1024:>7} KiB{_measure(count, size, config_text, args):>10.1f}"
            if args.whole_path:
                line += f"{asyncio.run(_measure_path(count, size, config_text, args)):>19.1f}"
            print(line)
    return 0


async def _measure_path(count: int, size: int, config_text: str | None, args: argparse.Namespace) -> float:
    endpoints = bench_endpoints(count, now=time.monotonic())
    return await whole_path.measure(
        endpoints,
        size,
        config_text,
        cycles=args.cycles,
        repeat=args.repeat,
        prefilter=args.prefilter,
        fresh=args.fresh,
    )


def _measure(count: int, size: int, config_text: str | None, args: argparse.Namespace) -> float:
    endpoints = tuple(bench_endpoints(count, now=time.monotonic()))  # as the store's snapshot hands them out
    peers = None
    if args.peers:  # another replica (or worker) reports work on every endpoint, and keeps reporting
        peers = PeerLoads(ttl_s=1e9)
        peers.update(1, time.monotonic(), {e.key: (3, 3000) for e in endpoints}, full=True)
    ctx = PluginContext(clock=time.monotonic, inflight=InflightTracker(), rng=random.Random(0), peers=peers)
    scheduler = Scheduler(load_config(config_text, ctx), ctx, prefilter_k=args.prefilter)
    warm = whole_path.WARM_CYCLES
    bodies = fresh_prompt_bodies(size, warm + args.cycles * args.repeat) if args.fresh else prompt_bodies(size)
    requests = [parse_request({":path": "/v1/completions"}, body) for body in bodies]

    sent = itertools.count()  # across the timings: with ``--fresh`` no prompt comes twice

    def cycles(n: int) -> None:
        for _ in range(n):
            req = requests[next(sent) % len(requests)]
            scheduler.pre_request(req, scheduler.schedule(req, endpoints))

    cycles(warm)  # warm the prefix index
    timings = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        cycles(args.cycles)
        timings.append((time.perf_counter() - started) / args.cycles * 1e6)
    return float(statistics.median(timings))


def bench_endpoints(count: int, *, now: float) -> list[Endpoint]:
    """``count`` endpoints with varied scraped metrics (sampled at ``now``)."""
    return [
        Endpoint(
            key=f"10.{i // 250}.{i % 250}.1:8000",
            address=f"10.{i // 250}.{i % 250}.1",
            port=8000,
            metrics=EndpointMetrics(waiting=i % 7, running=i % 5, kv_usage=(i % 10) / 10, updated_at=now),
        )
        for i in range(count)
    ]
