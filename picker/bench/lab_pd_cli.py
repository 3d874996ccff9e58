"""``picker bench lab-pd``: prefill/decode disaggregation against aggregation, in the policy lab.

    picker bench lab-pd                                   # the report's sweep (docs/disaggregation.md)
    picker bench lab-pd --workloads long-prompt --rates 8 --fleets 8,2p6d,4p4d --deciders always,prefix:512
    picker bench lab-pd --quick                           # a CI-sized run

Every fleet runs llm-d's P/D sample configuration (``lab_pd.pd_config``: prefix 2 + queue 1 behind the role
filters) with each decider; a fleet without roles (``8``) routes decode-only with it, as aggregated serving
does, so the decider changes nothing there and it runs once. Engines are ``h100-8b`` (25 000 KV blocks, an H100
with an 8B model) with the KV transfer over a ``--link-gbps`` link (100 Gb/s: 10.5 µs per token). Each workload
has its own rates (``WORKLOADS``), chosen around where the aggregated fleet's TTFT starts to climb.

The table gives, per workload and rate: TTFT p50/p90, TPOT p50/p90 (per request: (e2e - TTFT) / (tokens - 1)),
the worst gap between two tokens at p90 over requests, throughput, and the share of requests disaggregated.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from picker.bench import flags, lab_pd
from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, LabRun, poisson_schedule, run_lab
from picker.bench.lab_pd import Fleet
from picker.bench.policies import SchedulerPolicy
from picker.bench.report import Dist, summarize
from picker.scheduling import Scheduler, load_config
from picker.scheduling.framework import PluginContext
from picker.sim.config import DEFAULT_LINK_GBPS, KV_BYTES_PER_TOKEN_8B, link_s_per_token, preset

__all__ = ["DEFAULT_DECIDERS", "DEFAULT_FLEETS", "WORKLOADS", "PdRow", "configure", "run", "run_matrix"]

DEFAULT_FLEETS = "8,2p6d,4p4d,6p2d"
DEFAULT_DECIDERS = "always,prefix:16,prefix:512,length:1024"
SEED = 0


@dataclass(frozen=True, slots=True)
class _Workload:
    make: Any  # () -> wl.Workload
    rates: tuple[float, ...]
    quick_rate: float
    about: str


def _mixed(seed: int = SEED) -> wl.Workload:
    """Half long prompts with short answers, half short prompts with long answers, interleaved at random."""
    long_prompt = wl.with_fixed(wl.fixed_lengths(prompt_len=3072, output_len=128, seed=seed), 128)
    long_answer = wl.with_fixed(wl.fixed_lengths(prompt_len=256, output_len=1024, seed=seed + 1), 1024)

    def make() -> Iterator[wl.WorkItem]:
        rng = random.Random(seed)
        a, b = iter(long_prompt), iter(long_answer)
        while True:
            item = next(a) if rng.random() < 0.5 else next(b)
            yield dataclasses.replace(item, tag="long-prompt" if item.max_tokens == 128 else "long-answer")

    return wl.Workload("mixed", make)


WORKLOADS: dict[str, _Workload] = {
    "long-prompt": _Workload(
        lambda: wl.with_fixed(wl.fixed_lengths(prompt_len=3072, output_len=128, seed=SEED), 128),
        (4.0, 8.0, 12.0),
        8.0,
        "3072-token prompts, 128-token answers",
    ),
    "long-answer": _Workload(
        lambda: wl.with_fixed(wl.fixed_lengths(prompt_len=256, output_len=1024, seed=SEED), 1024),
        (8.0, 16.0, 24.0),
        16.0,
        "256-token prompts, 1024-token answers",
    ),
    "mixed": _Workload(_mixed, (4.0, 8.0), 8.0, "half long-prompt, half long-answer"),
    "shared-prefix": _Workload(
        lambda: wl.shared_prefix(
            num_groups=16, prompts_per_group=16, system_prompt_len=2048, question_len=128, output_len=128, seed=SEED
        ),
        (8.0, 16.0),
        16.0,
        "16 system prompts of 2048 tokens + 128-token questions, 128-token answers",
    ),
}


@dataclass(frozen=True, slots=True)
class PdRow:
    workload: str
    rate: float
    fleet: str
    decider: str  # "-" for a fleet without roles
    requests: int
    failed: int
    disaggregated: float  # share of the successful requests
    ttft_s: Dist
    tpot_s: Dist
    max_itl_s: Dist
    throughput_rps: float
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {', '.join(WORKLOADS)}")
    parser.add_argument("--fleets", default=DEFAULT_FLEETS, help=f"comma list, e.g. 8,2p6d (default {DEFAULT_FLEETS})")
    parser.add_argument(
        "--deciders", default=DEFAULT_DECIDERS, help=f"comma list of always, prefix:N, length:N ({DEFAULT_DECIDERS})"
    )
    parser.add_argument("--rates", help="comma list of req/s for every workload (default: each workload's own)")
    parser.add_argument("--requests", type=int, default=800, help="requests per run (default 800)")
    parser.add_argument("--seed", type=int, default=SEED, help="arrivals and the policies' random source")
    parser.add_argument("--link-gbps", type=float, default=DEFAULT_LINK_GBPS, help="KV transfer link, Gb/s")
    parser.add_argument("--quick", action="store_true", help="CI size: 200 requests, one rate per workload")
    parser.add_argument("--json", type=Path, help="write every run's numbers")
    parser.add_argument("--markdown", type=Path, help="write the tables as Markdown (as in docs/performance.md)")


def _policy(text: str) -> Any:
    def factory(ctx: PluginContext) -> SchedulerPolicy:
        return SchedulerPolicy("llm-d P/D sample", Scheduler(load_config(text, ctx), ctx))

    return factory


def run_matrix(
    workloads: Sequence[str],
    fleets: Sequence[Fleet],
    deciders: Sequence[str],
    *,
    requests: int,
    rates: Sequence[float] | None = None,
    quick: bool = False,
    seed: int = SEED,
    link_gbps: float = DEFAULT_LINK_GBPS,
    on_row: Any = None,
) -> list[PdRow]:
    """Every workload x rate x fleet x decider (deciders only for fleets with roles)."""
    engine = preset("h100-8b", kv_transfer_s_per_token=link_s_per_token(KV_BYTES_PER_TOKEN_8B, link_gbps))
    configs = {d: lab_pd.pd_config(d) for d in deciders}
    rows: list[PdRow] = []
    for name in workloads:
        spec = WORKLOADS[name]
        workload = spec.make()
        for rate in rates or ((spec.quick_rate,) if quick else spec.rates):
            arrivals = poisson_schedule(workload, rate, requests, seed)
            for fleet in fleets:
                for decider in deciders if fleet.disaggregated else deciders[:1]:
                    roles = fleet.roles if fleet.disaggregated else ()
                    config = LabConfig(engine, engines=fleet.engines, seed=seed, roles=roles)
                    lab_run = run_lab(config, _policy(configs[decider]), arrivals, workload=workload, rate=rate)
                    row = _row(name, rate, fleet, decider if fleet.disaggregated else "-", lab_run)
                    rows.append(row)
                    if on_row is not None:
                        on_row(row)
    return rows


def _row(workload: str, rate: float, fleet: Fleet, decider: str, lab_run: LabRun) -> PdRow:
    summary = summarize(lab_run.result)
    ok = [r for r in lab_run.result.records if r.ok]
    return PdRow(
        workload=workload,
        rate=rate,
        fleet=fleet.name,
        decider=decider,
        requests=summary.requests,
        failed=summary.failed,
        disaggregated=lab_run.disaggregated / len(ok) if ok else 0.0,
        ttft_s=summary.ttft_s,
        tpot_s=summary.tpot_s,
        max_itl_s=Dist.of([r.max_itl_s for r in ok if r.output_tokens > 1]),
        throughput_rps=summary.throughput_rps,
        wall_s=lab_run.wall_s,
    )


def print_table(title: str, rows: Sequence[PdRow]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title=title, title_justify="left")
    columns = ("fleet", "decider", "P/D", "TTFT p50", "p90", "TPOT p50", "p90", "max ITL p90", "req/s", "failed")
    for col in columns:
        table.add_column(col, justify="left" if col in ("fleet", "decider") else "right")
    for r in rows:
        table.add_row(
            r.fleet,
            r.decider,
            f"{r.disaggregated:.0%}",
            _ms(r.ttft_s.p50),
            _ms(r.ttft_s.p90),
            f"{r.tpot_s.p50 * 1e3:.1f}",
            f"{r.tpot_s.p90 * 1e3:.1f}",
            _ms(r.max_itl_s.p90),
            f"{r.throughput_rps:.2f}",
            str(r.failed),
        )
    console.print(table)


def markdown(rows: Sequence[PdRow]) -> str:
    """One Markdown table per workload: every rate, fleet and decider."""
    out: list[str] = []
    for name in dict.fromkeys(r.workload for r in rows):
        out.append(f"**{name}** ({WORKLOADS[name].about})\n")
        columns = ["offered", "fleet", "decider", "P/D", "TTFT p50", "TTFT p90", "TPOT p50", "TPOT p90"]
        columns += ["max ITL p90", "done/s"]
        out.append("| " + " | ".join(columns) + " |")
        out.append("|" + "---|" * len(columns))
        for r in (r for r in rows if r.workload == name):
            out.append(
                f"| {r.rate:g} | {r.fleet} | {r.decider} | {r.disaggregated:.0%} | {_ms(r.ttft_s.p50)} | "
                f"{_ms(r.ttft_s.p90)} | {r.tpot_s.p50 * 1e3:.1f} | {r.tpot_s.p90 * 1e3:.1f} | "
                f"{_ms(r.max_itl_s.p90)} | {r.throughput_rps:.2f} |"
            )
        out.append("")
    return "\n".join(out)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}" if seconds < 10 else f"{seconds:.1f} s"


def run(args: argparse.Namespace) -> int:
    try:
        workloads = flags.names(args.workloads)
        unknown = [w for w in workloads if w not in WORKLOADS]
        if unknown or not workloads:
            raise ValueError(f"unknown workloads {unknown}; choose from {', '.join(WORKLOADS)}")
        fleets = [Fleet.parse(f) for f in flags.names(args.fleets)]
        deciders = flags.names(args.deciders)
        for d in deciders:
            lab_pd.pd_config(d)
        if not fleets or not deciders:
            raise ValueError("need at least one fleet and one decider")
        rates = flags.numbers(args.rates, "--rates", float, above=0) if args.rates else None
        requests = 200 if args.quick else args.requests
        if requests < 1 or args.link_gbps <= 0:
            raise ValueError("--requests must be >= 1 and --link-gbps > 0")
    except ValueError as exc:
        print(f"picker bench lab-pd: {exc}", file=sys.stderr)
        return 2
    print(
        f"lab-pd: {requests} requests per run, h100-8b engines, KV link {args.link_gbps:g} Gb/s "
        f"({link_s_per_token(KV_BYTES_PER_TOKEN_8B, args.link_gbps) * 1e6:.1f} µs per token), llm-d's P/D sample "
        f"config, seed {args.seed}",
        flush=True,
    )
    started = time.perf_counter()

    def progress(r: PdRow) -> None:
        print(f"  {r.workload} {r.rate:g} req/s, {r.fleet} {r.decider}: wall {r.wall_s:.1f} s", flush=True)

    rows = run_matrix(
        workloads, fleets, deciders, requests=requests, rates=rates, quick=args.quick, seed=args.seed,
        link_gbps=args.link_gbps, on_row=progress,
    )  # fmt: skip
    for name in workloads:
        for rate in sorted({r.rate for r in rows if r.workload == name}):
            group = [r for r in rows if r.workload == name and r.rate == rate]
            print_table(f"{name} ({WORKLOADS[name].about}) at {rate:g} req/s", group)
    print(f"lab-pd: {len(rows)} runs in {time.perf_counter() - started:.0f} s wall")
    if args.json:
        runs = [r.to_json() for r in rows]
        doc = {"requests": requests, "seed": args.seed, "link_gbps": args.link_gbps, "runs": runs}
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    if args.markdown:
        args.markdown.write_text(markdown(rows))
        print(f"wrote {args.markdown}")
    return 0
