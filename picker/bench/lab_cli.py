"""``picker bench lab``: routing policies against N simulated engines in virtual time, one table per rate.

    picker bench lab                                           # the default sweep (docs/lab.md)
    picker bench lab --workload shared-prefix --engines 8 --rates 20,40,80,160 --requests 2000 \\
        --policies rr,lc,p2c,random,reference,picker,cache-aware,lmetric --seed 0 --json lab.json --png lab.png
    picker bench lab --rate 80 --requests 10000 --policies reference --config my-config.yaml

Every policy sees the same requests at the same times (the workload and the arrival schedule depend only on
the seed). The logic lives in ``lab`` (the simulation), ``policies`` and ``lab_report``; this module parses flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from picker import errors
from picker.bench import flags, lab_report
from picker.bench.lab import LabConfig, poisson_schedule, run_lab
from picker.bench.load import RequestRecord
from picker.bench.load_cli import WorkloadDefaults, add_workload_arguments, build_workload
from picker.bench.policies import POLICY_NAMES
from picker.bench.workloads import with_slos
from picker.scheduling import units
from picker.sim.config import PRESETS, EngineConfig, preset

__all__ = ["DEFAULT_POLICIES", "DEFAULT_RATES", "LAB_SIZES", "configure", "engine_config", "run"]

DEFAULT_POLICIES = "rr,lc,p2c,random,reference,picker,cache-aware,lmetric"
DEFAULT_RATES = "20,40,80,160,320"
# Per preset, the engine size of the default sweep: a KV pool that holds a few of the workload's system prompts
# but not all of them, so where a prompt goes decides whether its prefix is cached (docs/lab.md).
LAB_SIZES: dict[str, dict[str, int]] = {"h100-8b": {"num_gpu_blocks": 2048}}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policies", default=DEFAULT_POLICIES, help=f"comma list of {', '.join(POLICY_NAMES)}")
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="FILE",
        help="also run picker's scheduler with this EndpointPickerConfig (same as config:FILE in --policies)",
    )
    rates = parser.add_mutually_exclusive_group()
    rates.add_argument("--rate", type=units.above(0), help="one Poisson arrival rate, req/s")
    rates.add_argument("--rates", default=DEFAULT_RATES, help=f"comma list of rates (default {DEFAULT_RATES})")
    parser.add_argument("--requests", type=units.at_least(1), default=2000, help="requests per run (default 2000)")
    parser.add_argument("--seed", type=int, default=0, help="workload, arrivals and the policies' random source")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions")
    parser.add_argument(
        "--scrape-interval", type=units.above(0), default=0.1, metavar="S", help="metrics scrape interval, virtual s"
    )

    e = parser.add_argument_group("engines")
    e.add_argument("--engines", type=units.at_least(1), default=8)
    e.add_argument("--preset", choices=sorted(PRESETS), default="h100-8b")
    e.add_argument("--num-gpu-blocks", type=units.at_least(1), help="KV blocks per engine (default: 2048 for h100-8b)")
    e.add_argument("--max-num-seqs", type=units.at_least(1))
    e.add_argument("--max-loras", type=units.at_least(1), help="adapters per batch (with --lora)")

    add_workload_arguments(
        parser.add_argument_group("workload (as picker load)"),
        WorkloadDefaults(
            workload="shared-prefix", groups=32, prompts_per_group=16, system_len=2048, sessions=32,
            lora_help="comma-separated adapters (served by every engine)",
        ),
    )  # fmt: skip

    parser.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="TAG:TTFT_MS[:TPOT_MS]",
        help="llm-d SLO headers on the requests of a workload tag (e.g. short:150); prints each policy's attainment",
    )
    parser.add_argument(
        "--slo-without-headers",
        action="store_true",
        help="count the attainment of --slo without sending the headers (the policies schedule as without objectives)",
    )
    o = parser.add_argument_group("output")
    o.add_argument("--json", type=Path, help="write every run's summary (deterministic for a seed)")
    o.add_argument("--records", action="store_true", help="include per-request records in --json")
    o.add_argument("--png", "--plot", dest="png", type=Path, help="write a PNG (TTFT/TPOT, TTFT p90 vs rate, shares)")


def engine_config(args: argparse.Namespace) -> EngineConfig:
    changes: dict[str, Any] = dict(LAB_SIZES.get(args.preset, {}))
    if args.num_gpu_blocks is not None:
        changes["num_gpu_blocks"] = args.num_gpu_blocks
    if args.max_num_seqs is not None:
        changes["max_num_seqs"] = args.max_num_seqs
    if args.lora:
        changes["lora_adapters"] = tuple(flags.names(args.lora))
    if args.max_loras is not None:
        changes["max_loras"] = args.max_loras
    return preset(args.preset, **changes)


def _policies(args: argparse.Namespace) -> list[str]:
    names = flags.names(args.policies) + [f"config:{path}" for path in args.config]
    if not names:
        raise ValueError("no policies given")
    return names


def _rates(args: argparse.Namespace) -> list[float]:
    if args.rate is not None:  # its parser type refuses a rate not above 0
        return [args.rate]
    return flags.numbers(args.rates, "--rates", float, above=0)


def parse_slos(specs: Sequence[str]) -> dict[str, tuple[float | None, float | None]]:
    """``TAG:TTFT_MS[:TPOT_MS]`` each (an empty or 0 part: unset) -> tag -> (TTFT ms, TPOT ms)."""
    out: dict[str, tuple[float | None, float | None]] = {}
    for spec in specs:
        parts = spec.split(":")
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError(f"--slo {spec!r}: expected TAG:TTFT_MS[:TPOT_MS]")
        try:
            values = [float(x) if x else 0.0 for x in parts[1:]]
        except ValueError:
            raise ValueError(f"--slo {spec!r}: milliseconds must be numbers") from None
        ttft, tpot = values[0], values[1] if len(values) > 1 else 0.0
        if ttft < 0 or tpot < 0 or not (ttft or tpot):
            raise ValueError(f"--slo {spec!r}: give a positive TTFT or TPOT")
        out[parts[0]] = (ttft or None, tpot or None)
    return out


def slo_attainment(
    records: Sequence[RequestRecord], slos: Mapping[str, tuple[float | None, float | None]]
) -> tuple[int, int]:
    """(met, total) over the requests whose tag has an SLO: a request meets it when it succeeded within every
    objective set (TTFT, and TPOT where it has one)."""
    met = total = 0
    for r in records:
        slo = slos.get(r.tag)
        if slo is None:
            continue
        total += 1
        ttft, tpot = slo
        if not r.ok or r.ttft_s is None:
            continue
        if ttft is not None and r.ttft_s * 1000.0 > ttft:
            continue
        if tpot is not None and r.tpot_s is not None and r.tpot_s * 1000.0 > tpot:
            continue
        met += 1
    return met, total


def run(args: argparse.Namespace) -> int:
    try:
        workload = build_workload(args)
        slos = parse_slos(args.slo)
        if args.slo_without_headers and not slos:
            raise ValueError("--slo-without-headers needs --slo")
        if slos and not args.slo_without_headers:
            workload = with_slos(workload, slos)
        config = LabConfig(
            engine_config(args), engines=args.engines, scrape_interval_s=args.scrape_interval, api=args.api,
            seed=args.seed,
        )  # fmt: skip
        policies, rates = _policies(args), _rates(args)
        if args.requests < 1:
            raise ValueError("--requests must be >= 1")
    except ValueError as exc:
        print(f"picker bench lab: {exc}", file=sys.stderr)
        return 2
    e = config.engine
    print(
        f"lab: {workload.name}, {args.requests} requests per run, {config.engines} x {args.preset} engines "
        f"({e.num_gpu_blocks} KV blocks of {e.block_size} tokens, max {e.max_num_seqs} seqs), "
        f"scrape every {config.scrape_interval_s * 1e3:g} ms, seed {args.seed}",
        flush=True,
    )
    servers = [f"sim-{i}" for i in range(config.engines)]
    rows: list[lab_report.Row] = []
    runs_json: list[dict[str, Any]] = []
    started = time.perf_counter()
    for rate in rates:
        arrivals = poisson_schedule(workload, rate, args.requests, args.seed)
        rate_rows = []
        for policy in policies:
            try:
                lab_run = run_lab(config, policy, arrivals, workload=workload, rate=rate)
            except (ValueError, errors.ConfigError) as exc:
                print(f"picker bench lab: policy {policy!r}: {exc}", file=sys.stderr)
                return 2
            print(
                f"  {policy} at {rate:g} req/s: {len(arrivals)} requests, {lab_run.events} events, "
                f"wall {lab_run.wall_s:.2f} s",
                flush=True,
            )
            row = lab_report.make_row(lab_run.policy, lab_run.result, servers, rate)
            rate_rows.append(row)
            if slos:
                met, total = slo_attainment(lab_run.result.records, slos)
                print(f"    SLO attainment: {met} of {total} ({met / max(1, total):.1%})", flush=True)
            runs_json.append({**lab_report.row_json(row, records=args.records), **lab_run.to_json()})
        lab_report.print_rows(f"{workload.name} at {rate:g} req/s ({config.engines} engines)", rate_rows)
        rows.extend(rate_rows)
    print(f"lab: {len(rows)} runs, {len(rows) * args.requests} requests in {time.perf_counter() - started:.1f} s wall")
    if args.json:
        doc = {
            "lab": {
                "workload": workload.name,
                "requests": args.requests,
                "rates": rates,
                "policies": policies,
                "seed": args.seed,
                "api": args.api,
                "engines": config.engines,
                "preset": args.preset,
                "engine_config": dataclasses.asdict(config.engine),
                "scrape_interval_s": config.scrape_interval_s,
            },
            "runs": runs_json,
        }
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    if args.png:
        lab_report.plot_rows(rows, args.png, f"policy lab: {workload.name}, {config.engines} x {args.preset}")
        print(f"wrote {args.png}")
    return 0
