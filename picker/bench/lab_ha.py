"""``picker bench lab-ha``: N picker replicas behind one gateway, independent (today) vs with the peer exchange.

    picker bench lab-ha                                  # the acceptance table of docs/ha.md (~3 min on 2 cores)
    picker bench lab-ha --delays-ms 1,5,20 --loss 0.1    # sensitivity to the exchange's delay, lost batches
    picker bench lab-ha --quick                          # small (tests)
    picker bench lab-ha --config my.yaml                 # another configuration

For each workload and rate (shared-prefix at 40 and 160 req/s, multi-turn at 20 and 40: below and past the knee,
as ``lab-eval``'s scenarios), picker's default on 8 simulated engines with 1 replica, and with 2 and 4 replicas
behind a gateway that spreads requests over them (``--spread`` rr or random): once independent (each replica's
own ledger and prefix index: ``Scenario(replicas=N)``), once with the exchange (``Scenario(exchange=True)``, each
``--delays-ms`` value). It prints p90 TTFT and the prefix-cache hit share, both against one replica, and for the
exchange the bytes sent (all replicas, per request, and per second scaled to 1k req/s). A row passes when p90 TTFT
and hit share are both within ``--tolerance`` (5 %) of one replica's.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import orjson

from picker import errors
from picker.bench import flags
from picker.bench.lab import LabConfig, Scenario, poisson_schedule, run_lab
from picker.bench.lab_eval import ENGINES, EVAL_WORKLOADS, PICKER
from picker.bench.report import summarize
from picker.scheduling import units

__all__ = ["POINTS", "HaRow", "configure", "evaluate", "run"]

POINTS: tuple[tuple[str, float], ...] = (
    ("shared-prefix", 40.0),
    ("shared-prefix", 160.0),
    ("multi-turn", 20.0),
    ("multi-turn", 40.0),
)
QUICK_POINTS: tuple[tuple[str, float], ...] = (("shared-prefix", 160.0),)
DEFAULT_FLUSH_MS = 2.0  # ExchangeSettings.flush_interval_s as picker serve runs it (--peer-flush-interval)


@dataclass(frozen=True, slots=True)
class HaRow:
    workload: str
    rate: float
    replicas: int
    mode: str  # "one", "independent", or "exchange <delay> ms"
    p90_ttft_s: float
    p50_ttft_s: float
    hit_share: float
    throughput_rps: float
    exchange_bytes: int
    requests: int
    duration_s: float
    p90_vs_one: float = 1.0  # p90 / one replica's p90
    hit_vs_one: float = 1.0  # hit share / one replica's hit share

    def within(self, tolerance: float) -> bool:
        return self.p90_vs_one <= 1.0 + tolerance and self.hit_vs_one >= 1.0 - tolerance

    @property
    def bytes_per_request(self) -> float:
        return self.exchange_bytes / self.requests if self.requests else 0.0

    @property
    def bytes_per_s_per_krps(self) -> float:
        """Exchange bytes per second over the run (first arrival to last response), all replicas together,
        scaled from the offered rate to 1000 req/s."""
        if self.duration_s <= 0 or self.rate <= 0:
            return 0.0
        return self.exchange_bytes / self.duration_s * 1000.0 / self.rate


def _point(
    workload: str, rate: float, replicas: int, delay_ms: float | None, flush_ms: float, loss: float,
    spread: Literal["rr", "random"], requests: int, seed: int, policy: str = PICKER,
) -> HaRow:  # fmt: skip
    w = EVAL_WORKLOADS[workload]
    arrivals = poisson_schedule(w.make(seed), rate, requests, seed)
    exchange = delay_ms is not None and replicas > 1
    scenario = Scenario(
        replicas=replicas, spread=spread, exchange=exchange, exchange_delay_s=(delay_ms or 0.0) / 1e3,
        exchange_flush_s=flush_ms / 1e3, exchange_loss=loss if exchange else 0.0,
    )  # fmt: skip
    run_ = run_lab(LabConfig(w.engine, engines=ENGINES, seed=seed, scenario=scenario), policy, arrivals, rate=rate)
    s = summarize(run_.result)
    mode = "one" if replicas == 1 else (f"exchange {delay_ms:g} ms" if exchange else "independent")
    return HaRow(
        workload, rate, replicas, mode, s.ttft_s.p90, s.ttft_s.p50, s.cached_share, s.throughput_rps,
        run_.exchange_bytes, len(arrivals), run_.result.duration_s,
    )  # fmt: skip


def evaluate(
    points: Sequence[tuple[str, float]],
    *,
    replicas: Sequence[int] = (2, 4),
    delays_ms: Sequence[float] = (1.0,),
    flush_ms: float = DEFAULT_FLUSH_MS,
    loss: float = 0.0,
    spread: Literal["rr", "random"] = "rr",
    requests: int = 1500,
    seed: int = 0,
    jobs: int = 1,
    policy: str = PICKER,
) -> list[HaRow]:
    """Every point with one replica, then each replica count independent and with each exchange delay; every
    replica runs ``policy`` (picker's default, or ``config:FILE``)."""
    todo: list[tuple[str, float, int, float | None]] = []
    for workload, rate in points:
        todo.append((workload, rate, 1, None))
        for n in replicas:
            todo.append((workload, rate, n, None))
            todo += [(workload, rate, n, d) for d in delays_ms]
    args = [(*t, flush_ms, loss, spread, requests, seed, policy) for t in todo]
    if jobs <= 1:
        rows = [_point(*a) for a in args]
    else:
        with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
            rows = list(pool.map(_point, *zip(*args, strict=True)))
    one = {(r.workload, r.rate): r for r in rows if r.replicas == 1}
    out = []
    for r in rows:
        base = one[(r.workload, r.rate)]
        p90 = r.p90_ttft_s / base.p90_ttft_s if base.p90_ttft_s > 0 else 1.0
        hit = r.hit_share / base.hit_share if base.hit_share > 0 else 1.0
        out.append(HaRow(**{**asdict(r), "p90_vs_one": p90, "hit_vs_one": hit}))
    return out


def table(rows: Sequence[HaRow], tolerance: float) -> str:
    lines = [
        "| workload | req/s | replicas | mode | p90 TTFT | vs 1 | hit share | vs 1 | exchange B/req | "
        "exchange kB/s per 1k req/s | within |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        exchange = r.mode.startswith("exchange")
        lines.append(
            f"| {r.workload} | {r.rate:g} | {r.replicas} | {r.mode} | {r.p90_ttft_s * 1e3:.0f} ms | "
            f"{r.p90_vs_one:.2f}x | {r.hit_share:.1%} | {r.hit_vs_one:.3f}x | "
            f"{f'{r.bytes_per_request:.0f}' if exchange else '-'} | "
            f"{f'{r.bytes_per_s_per_krps / 1e3:.0f}' if exchange else '-'} | "
            f"{'-' if r.replicas == 1 else ('yes' if r.within(tolerance) else 'no')} |"
        )
    return "\n".join(lines) + "\n"


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--replicas", default="2,4", help="replica counts besides 1 (comma list)")
    add("--delays-ms", default="1", help="exchange delays to run, ms (comma list; from a flush to the peer applying)")
    add("--flush-ms", type=units.above(0), default=DEFAULT_FLUSH_MS, help="each replica's flush interval, ms")
    add("--loss", type=units.fraction, default=0.0, help="share of exchange batches lost")
    add("--spread", choices=("rr", "random"), default="rr", help="how the gateway spreads requests over replicas")
    add("--requests", type=units.at_least(1), default=None, help="requests per run (default 1500; 400 with --quick)")
    add(
        "--tolerance",
        type=units.at_least(0.0, float),
        default=0.05,
        help="a row passes within this of one replica (default 0.05)",
    )
    add("--quick", action="store_true", help="shared-prefix at 160 req/s only, 400 requests")
    add("--seed", type=int, default=0)
    add(
        "--jobs", type=units.at_least(1), default=os.cpu_count() or 1, help="parallel processes (default: one per core)"
    )
    add(
        "--config",
        type=Path,
        metavar="FILE",
        help="run every replica with this EndpointPickerConfig instead of picker's default",
    )
    add("--json", type=Path, help="write the rows")


def run(args: argparse.Namespace) -> int:
    try:
        replicas = flags.numbers(args.replicas, "--replicas", int, least=2)
        delays = flags.numbers(args.delays_ms, "--delays-ms", float, least=0)
        requests = args.requests if args.requests is not None else (400 if args.quick else 1500)
        if args.config is not None and not args.config.is_file():  # before any run starts
            raise ValueError(f"--config {args.config}: no such file")
        started = time.perf_counter()
        policy = PICKER if args.config is None else f"config:{args.config}"
        rows = evaluate(
            QUICK_POINTS if args.quick else POINTS, replicas=replicas, delays_ms=delays, flush_ms=args.flush_ms,
            loss=args.loss, spread=args.spread, requests=requests, seed=args.seed, jobs=args.jobs, policy=policy,
        )  # fmt: skip
    except (ValueError, errors.ConfigError) as exc:
        print(f"picker bench lab-ha: {exc}", file=sys.stderr)
        return 2
    what = "picker's default" if args.config is None else f"picker with {args.config}"
    print(
        f"{what} on {ENGINES} simulated h100-8b engines, {requests} requests per run, seed {args.seed}; "
        f"gateway spread {args.spread}; exchange flush {args.flush_ms:g} ms, loss {args.loss:.0%}"
    )
    print(table(rows, args.tolerance))
    checked = [r for r in rows if r.mode.startswith("exchange")]
    met = sum(r.within(args.tolerance) for r in checked)
    print(f"exchange rows within {args.tolerance:.0%} of one replica (p90 TTFT and hit share): {met} of {len(checked)}")
    print(f"lab-ha: {len(rows)} runs in {time.perf_counter() - started:.0f} s wall ({args.jobs} jobs)")
    if args.json:
        args.json.write_bytes(orjson.dumps([asdict(r) for r in rows], option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    return 0
