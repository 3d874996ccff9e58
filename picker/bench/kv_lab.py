"""``picker bench kv-lab``: precise vs approximate vs no prefix affinity in the policy lab, with KV events.

    picker bench kv-lab                                   # the report in docs/performance.md (~15 min)
    picker bench kv-lab --ratios 2 --replicas 4 --requests 500 --seeds 0    # one cell, quickly

The shared-prefix workload (inference-perf's ``shared_prefix``: groups of prompts with one system prompt each)
against ``--engines`` simulated H100s (``h100-8b``, ``--num-gpu-blocks`` KV blocks each), for each *working
set ratio* (the groups' system prompts ÷ the fleet's KV cache: < 1 fits, 2 to 4 churns) and each number of
picker replicas (``Scenario.replicas``: independent routers, requests spread round robin). The three
``EndpointPickerConfig`` files in docs/examples/kv-events are run on the same arrivals: ``precise``
(precise-prefix-cache-scorer 3, KV utilisation 2, queue 2; events delivered ``--kv-event-delay`` after the step
that caused them), ``approximate`` (prefix-cache-scorer in its place) and ``none`` (load only).

Reported per cell, averaged over ``--seeds``: TTFT p90 and mean, the prefix-cache hit rate (cached ÷ prompt
tokens, from the engines' own usage), output tokens/s (completed output ÷ the run's length), and precise's
TTFT p90 change against approximate. ``--external-share`` sends that share of the arrivals straight to a random
server, bypassing every picker (``Scenario.external_share``); the table then covers the routed requests.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from picker.bench import flags, workloads
from picker.bench.lab import LabConfig, Scenario, poisson_schedule, run_lab
from picker.bench.load import RequestRecord
from picker.scheduling import units
from picker.sim.config import preset

__all__ = ["CONFIGS", "Cell", "configure", "run", "run_cell"]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "kv-events"
CONFIGS = ("precise", "approximate", "none")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ratios", default="0.5,2,3", help="working set ÷ fleet KV, comma list (default 0.5,2,3)")
    parser.add_argument("--replicas", default="1,4", help="picker replicas, comma list (default 1,4)")
    parser.add_argument("--rate", type=units.above(0), default=12.0, help="Poisson arrivals, req/s (default 12)")
    parser.add_argument("--requests", type=units.at_least(1), default=1500)
    parser.add_argument("--seeds", default="0,1", help="comma list; results are averaged (default 0,1)")
    parser.add_argument("--engines", type=units.at_least(1), default=8)
    parser.add_argument(
        "--num-gpu-blocks", type=units.at_least(1), default=2048, help="KV blocks of 16 tokens per engine"
    )
    parser.add_argument(
        "--system-len", type=units.at_least(1), default=4000, help="system prompt tokens (default 4000)"
    )
    parser.add_argument("--question-len", type=units.at_least(1), default=128)
    parser.add_argument("--output-len", type=units.at_least(1), default=64)
    parser.add_argument("--prompts-per-group", type=units.at_least(1), default=5)
    parser.add_argument(
        "--kv-event-delay", type=units.at_least(0.0, float), default=0.005, help="seconds (default 0.005)"
    )
    parser.add_argument(
        "--external-share",
        type=units.fraction,
        default=0.0,
        help="share of requests sent straight to a server (default 0)",
    )
    parser.add_argument("--configs-dir", type=Path, default=EXAMPLES, help="where precise/approximate/none.yaml are")
    parser.add_argument("--json", type=Path, help="write every cell")


@dataclass(frozen=True, slots=True)
class Cell:
    ratio: float
    replicas: int
    config: str
    ttft_p90_s: float
    ttft_mean_s: float
    hit_rate: float
    output_tok_s: float
    ok: int
    failed: int


def _stats(records: list[RequestRecord]) -> tuple[float, float, float, float, int, int]:
    ok = [r for r in records if r.status == 200 and r.ttft_s is not None]
    ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    p90 = ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))] if ttft else float("nan")
    mean = statistics.fmean(ttft) if ttft else float("nan")
    prompt = sum(r.prompt_tokens or 0 for r in ok)
    hit = sum(r.cached_tokens or 0 for r in ok) / prompt if prompt else 0.0
    end = max((r.end_s for r in ok), default=0.0)
    out = sum(r.output_tokens for r in ok) / end if end > 0 else 0.0
    return p90, mean, hit, out, len(ok), len(records) - len(ok)


def run_cell(args: argparse.Namespace, ratio: float, replicas: int, seeds: list[int]) -> list[Cell]:
    fleet_tokens = args.engines * args.num_gpu_blocks * 16
    groups = max(1, round(ratio * fleet_tokens / args.system_len))
    engine = preset("h100-8b", num_gpu_blocks=args.num_gpu_blocks)
    scenario = Scenario(replicas=replicas, external_share=args.external_share)
    lab = LabConfig(engine, engines=args.engines, scenario=scenario, kv_event_delay_s=args.kv_event_delay)
    per_config: dict[str, list[tuple[float, float, float, float, int, int]]] = {c: [] for c in CONFIGS}
    for seed in seeds:
        workload = workloads.shared_prefix(
            num_groups=groups,
            prompts_per_group=args.prompts_per_group,
            system_prompt_len=args.system_len,
            question_len=args.question_len,
            output_len=args.output_len,
            seed=seed,
        )
        arrivals = poisson_schedule(workload, args.rate, args.requests, seed)
        for name in CONFIGS:
            config = dataclasses.replace(lab, seed=seed)
            result = run_lab(config, f"config:{args.configs_dir / f'{name}.yaml'}", arrivals, rate=args.rate)
            per_config[name].append(_stats(result.result.records))
    cells = []
    for name, rows in per_config.items():
        cells.append(
            Cell(
                ratio,
                replicas,
                name,
                statistics.fmean(r[0] for r in rows),
                statistics.fmean(r[1] for r in rows),
                statistics.fmean(r[2] for r in rows),
                statistics.fmean(r[3] for r in rows),
                sum(r[4] for r in rows),
                sum(r[5] for r in rows),
            )
        )
    return cells


def run(args: argparse.Namespace) -> int:
    try:
        ratios = flags.numbers(args.ratios, "--ratios", float, above=0)
        replica_counts = flags.numbers(args.replicas, "--replicas", int, least=1)
        seeds = flags.numbers(args.seeds, "--seeds", int, least=0, ranges=True, distinct=True)
    except ValueError as exc:
        print(f"picker bench kv-lab: {exc}", file=sys.stderr)
        return 2
    fleet = args.engines * args.num_gpu_blocks * 16
    print(
        f"kv-lab: {args.engines} x h100-8b ({args.num_gpu_blocks} blocks: {fleet:,} KV tokens in the fleet), "
        f"shared prefix {args.system_len}+{args.question_len} -> {args.output_len} tokens, {args.rate:g} req/s, "
        f"{args.requests} requests, seeds {seeds}, KV events after {args.kv_event_delay * 1e3:g} ms",
        flush=True,
    )
    print(
        f"{'working set':>11} {'replicas':>8} {'config':<12} {'TTFT p90':>9} {'mean':>7} {'hit':>6} {'out tok/s':>9}"
        "  vs approx p90"
    )
    all_cells: list[Cell] = []
    started = time.perf_counter()
    for ratio in ratios:
        for replicas in replica_counts:
            cells = run_cell(args, ratio, replicas, seeds)
            approx = next(c for c in cells if c.config == "approximate")
            for c in cells:
                delta = f"{(c.ttft_p90_s / approx.ttft_p90_s - 1) * 100:+.0f} %" if c.config == "precise" else ""
                print(
                    f"{ratio:>10g}x {replicas:>8} {c.config:<12} {c.ttft_p90_s:>8.3f}s {c.ttft_mean_s:>6.3f}s "
                    f"{c.hit_rate:>6.3f} {c.output_tok_s:>9.0f}  {delta}",
                    flush=True,
                )
            all_cells.extend(cells)
    print(f"kv-lab: {len(all_cells)} cells in {time.perf_counter() - started:.0f} s wall")
    if args.json:
        args.json.write_bytes(
            orjson.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "cells": all_cells}, option=orjson.OPT_INDENT_2
            )
        )
        print(f"wrote {args.json}")
    return 0
