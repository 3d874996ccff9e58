"""``picker bench lab-eval``: picker's default against the baselines over the standard workloads (the lab report).

    picker bench lab-eval --json lab-eval.json --png docs/img/lab-eval.png --markdown lab-eval.md   # ~3 minutes
    picker bench lab-eval --quick                                                # a small version (tests, ~20 s)
    picker bench lab-eval --workloads shared-prefix --config candidate.yaml      # a candidate default, alongside

Four workloads (``EVAL_WORKLOADS``), each on 8 simulated ``h100-8b`` engines at a ladder of rates chosen around
round robin's knee (where its p90 TTFT blows up) and past it; every policy sees the same requests at the same
times (one seed). For each workload and rate it prints the lab's table and the ratios the issue asks about:
picker's p90 TTFT against the best baseline's (the lowest p90 among the other policies) and against round robin's.
``--json`` writes every run's summary and the ratios; ``--png`` one plot, p90 TTFT against the rate per workload.
The numbers and what they mean are in docs/performance.md ("Scheduling: policy lab") and docs/scheduling.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from picker import errors
from picker.bench import lab_report
from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, poisson_schedule, run_lab
from picker.sim.config import EngineConfig, preset

__all__ = [
    "BASELINE_POLICIES",
    "EVAL_WORKLOADS",
    "PICKER",
    "EvalWorkload",
    "Ratio",
    "configure",
    "evaluate",
    "plot",
    "ratios",
    "run",
]

PICKER = "picker"
BASELINE_POLICIES = ("rr", "lc", "p2c", "reference", "cache-aware", "lmetric")
ENGINES = 8
LORA_ADAPTERS = ("lora-a", "lora-b", "lora-c")
LORA_WEIGHTS = (60.0, 30.0, 10.0)  # GIE's regression mix


@dataclass(frozen=True, slots=True)
class EvalWorkload:
    """A standard workload with the engines it runs on and its rate ladder (req/s)."""

    name: str
    make: Callable[[int], wl.Workload]  # seed -> workload
    engine: EngineConfig
    rates: tuple[float, ...]
    quick_rates: tuple[float, ...]
    what: str


def _engine(**changes: Any) -> EngineConfig:
    # A KV pool (2048 blocks = 32k tokens) that holds a few long prefixes but not all (docs/lab.md).
    return preset("h100-8b", num_gpu_blocks=2048, **changes)


EVAL_WORKLOADS: dict[str, EvalWorkload] = {
    w.name: w
    for w in (
        EvalWorkload(
            "shared-prefix",
            lambda seed: wl.shared_prefix(
                num_groups=32, prompts_per_group=16, system_prompt_len=2048, question_len=64, output_len=64, seed=seed
            ),
            _engine(),
            rates=(20.0, 40.0, 80.0, 160.0, 320.0),
            quick_rates=(40.0,),
            what="32 system prompts of 2048 tokens x 16 questions of 64, answers of ~64 tokens",
        ),
        EvalWorkload(
            # 30 sessions, not a multiple of the 8 engines: with 32, round robin would send every turn of a
            # session to the same engine by accident (turns interleave session by session).
            "multi-turn",
            lambda seed: wl.multi_turn_chat(
                sessions=30, turns=4, system_prompt_len=2048, question_len=64, answer_len=64, output_len=64, seed=seed
            ),
            _engine(),
            rates=(10.0, 20.0, 40.0, 80.0),
            quick_rates=(20.0,),
            what="30 concurrent sessions of 4 turns, each turn resending the 2048-token system prompt and history",
        ),
        EvalWorkload(
            "short-long",
            lambda seed: wl.short_long(seed=seed),
            _engine(),
            rates=(100.0, 200.0, 400.0, 800.0),
            quick_rates=(200.0,),
            what="the seed's mix: 13-token prompts, 80 % answered with 4 tokens, 20 % with 512",
        ),
        EvalWorkload(
            "multi-lora",
            lambda seed: wl.multi_lora(wl.sharegpt_like(seed=seed), LORA_ADAPTERS, LORA_WEIGHTS, seed=seed),
            _engine(lora_adapters=LORA_ADAPTERS, max_loras=1),
            rates=(5.0, 10.0, 20.0, 40.0),
            quick_rates=(10.0,),
            what="ShareGPT-shaped lengths over 3 adapters (60/30/10), engines with max_loras 1",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Ratio:
    """picker's default against the others at one workload and rate (p90 TTFT)."""

    workload: str
    rate: float
    picker_p90_s: float
    best_baseline: str
    best_baseline_p90_s: float
    rr_p90_s: float
    vs_best: float  # best baseline p90 / picker p90 (> 1: picker lower; 1.25 = picker 20 % below)
    vs_rr: float  # round robin p90 / picker p90
    lowest: bool  # picker's p90 is the lowest of all


def evaluate(
    workloads: Sequence[EvalWorkload],
    policies: Sequence[str],
    *,
    requests: int,
    seed: int = 0,
    quick: bool = False,
    log: Callable[[str], None] = print,
) -> dict[str, list[lab_report.Row]]:
    """Every policy on every workload at every rate of its ladder; rows per workload, in rate then policy order."""
    out: dict[str, list[lab_report.Row]] = {}
    servers = [f"sim-{i}" for i in range(ENGINES)]
    for w in workloads:
        workload = w.make(seed)
        config = LabConfig(w.engine, engines=ENGINES, seed=seed)
        rows: list[lab_report.Row] = []
        for rate in w.quick_rates if quick else w.rates:
            arrivals = poisson_schedule(workload, rate, requests, seed)
            for policy in policies:
                run_ = run_lab(config, policy, arrivals, workload=workload, rate=rate)
                rows.append(lab_report.make_row(policy, run_.result, servers, rate))
                log(f"  {w.name} {rate:g} req/s {policy}: wall {run_.wall_s:.1f} s")
        out[w.name] = rows
    return out


def ratios(name: str, rows: Sequence[lab_report.Row], picker: str = PICKER) -> list[Ratio]:
    """The ratios at each rate where picker and at least one other policy ran."""
    out = []
    for rate, at in lab_report.by_rate(rows).items():
        p90 = {r.label: r.summary.ttft_s.p90 for r in at}
        if picker not in p90 or len(p90) < 2 or rate is None:
            continue
        others = {k: v for k, v in p90.items() if k != picker}
        best = min(others, key=others.__getitem__)
        mine = p90[picker]
        rr = p90.get("rr", float("nan"))
        out.append(
            Ratio(
                name, rate, mine, best, others[best], rr, _div(others[best], mine), _div(rr, mine),
                lowest=mine <= others[best],
            )
        )  # fmt: skip
    return out


def _div(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def _run_json(row: lab_report.Row) -> dict[str, Any]:
    s = row.summary
    return {
        "policy": row.label,
        "rate": row.rate,
        "ttft_s": {"p50": s.ttft_s.p50, "p90": s.ttft_s.p90, "p99": s.ttft_s.p99, "mean": s.ttft_s.mean},
        "tpot_p50_s": s.tpot_s.p50,
        "e2e_p50_s": s.e2e_s.p50,
        "throughput_rps": s.throughput_rps,
        "output_tok_s": s.output_tok_s,
        "cached_share": s.cached_share,
        "imbalance": row.imbalance,
        "ok": s.ok,
        "failed": s.failed,
    }


def plot(results: dict[str, list[lab_report.Row]], path: str | Path, picker: str = PICKER) -> None:
    """p90 TTFT against the rate, one panel per workload, log y; picker's default drawn thick."""
    from matplotlib.figure import Figure  # no pyplot: no global state

    names = list(results)
    cols = 2 if len(names) > 1 else 1
    nrows = (len(names) + cols - 1) // cols
    fig = Figure(figsize=(6.5 * cols, 4.2 * nrows), layout="constrained")
    fig.suptitle(f"policy lab: p90 TTFT against the offered rate ({ENGINES} simulated h100-8b engines)")
    axes = fig.subplots(nrows, cols, squeeze=False).flat
    labels = list(dict.fromkeys(r.label for rows in results.values() for r in rows))
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for ax, name in zip(axes, names, strict=False):
        for label in labels:
            pts = sorted((r.rate, r.summary.ttft_s.p90 * 1e3) for r in results[name] if r.label == label and r.rate)
            if pts:
                thick = label == picker
                ax.plot(
                    [p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[label], label=label,
                    linewidth=3 if thick else 1.2, zorder=3 if thick else 2,
                )  # fmt: skip
        ax.set(title=name, xlabel="req/s", ylabel="p90 TTFT (ms)", yscale="log", xscale="log")
        ax.legend(fontsize="small")
    for ax in list(axes)[len(names) :]:
        ax.set_visible(False)
    fig.savefig(str(path), dpi=100)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads", default=",".join(EVAL_WORKLOADS), help=f"comma list of {', '.join(EVAL_WORKLOADS)}"
    )
    parser.add_argument(
        "--policies",
        default=",".join((*BASELINE_POLICIES, PICKER)),
        help="comma list of lab policies (picker bench lab --help); 'picker' is the one the ratios are about",
    )
    parser.add_argument("--config", action="append", default=[], metavar="FILE", help="also run config:FILE")
    parser.add_argument("--requests", type=int, help="requests per run (default 1500; 400 with --quick)")
    parser.add_argument("--quick", action="store_true", help="one rate per workload, 400 requests (tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write every run's summary and the ratios")
    parser.add_argument("--png", type=Path, help="write p90 TTFT against the rate, one panel per workload")
    parser.add_argument("--markdown", type=Path, help="write the p90 tables and the ratios as Markdown (the docs')")


def run(args: argparse.Namespace) -> int:
    try:
        names = [n.strip() for n in args.workloads.split(",") if n.strip()]
        unknown = [n for n in names if n not in EVAL_WORKLOADS]
        if unknown or not names:
            raise ValueError(f"unknown workload(s) {unknown}; choose from {', '.join(EVAL_WORKLOADS)}")
        policies = [p.strip() for p in args.policies.split(",") if p.strip()] + [f"config:{c}" for c in args.config]
        requests = args.requests if args.requests is not None else (400 if args.quick else 1500)
        if requests < 1 or not policies:
            raise ValueError("need --requests >= 1 and at least one policy")
    except ValueError as exc:
        print(f"picker bench lab-eval: {exc}", file=sys.stderr)
        return 2
    workloads = [EVAL_WORKLOADS[n] for n in names]
    started = time.perf_counter()
    try:
        results = evaluate(workloads, policies, requests=requests, seed=args.seed, quick=args.quick)
    except (ValueError, errors.ConfigError) as exc:
        print(f"picker bench lab-eval: {exc}", file=sys.stderr)
        return 2
    all_ratios: list[Ratio] = []
    for w in workloads:
        rows = results[w.name]
        for rate, at in lab_report.by_rate(rows).items():
            lab_report.print_rows(f"{w.name} at {rate:g} req/s ({ENGINES} engines): {w.what}", at)
        all_ratios += ratios(w.name, rows)
    _print_ratios(all_ratios)
    wall = time.perf_counter() - started
    print(f"lab-eval: {sum(len(r) for r in results.values())} runs of {requests} requests in {wall:.0f} s wall")
    if args.json:
        doc = {
            "eval": {
                "requests": requests,
                "seed": args.seed,
                "engines": ENGINES,
                "policies": policies,
                "quick": args.quick,
            },
            "workloads": {
                w.name: {
                    "what": w.what,
                    "rates": list(w.quick_rates if args.quick else w.rates),
                    "engine": {
                        "preset": "h100-8b",
                        "num_gpu_blocks": w.engine.num_gpu_blocks,
                        "lora_adapters": list(w.engine.lora_adapters),
                        "max_loras": w.engine.max_loras,
                    },
                    "runs": [_run_json(r) for r in results[w.name]],
                }
                for w in workloads
            },
            "ratios": [asdict(r) for r in all_ratios],
        }
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    if args.png:
        plot(results, args.png)
        print(f"wrote {args.png}")
    if args.markdown:
        args.markdown.write_text(markdown(workloads, results, all_ratios))
        print(f"wrote {args.markdown}")
    return 0


def markdown(workloads: Sequence[EvalWorkload], results: dict[str, list[lab_report.Row]], rs: Sequence[Ratio]) -> str:
    """Per workload, p90 TTFT by policy and rate (with the throughput in brackets where a policy served less than
    90 % of the offered rate), then the ratios."""
    out: list[str] = []
    for w in workloads:
        rows = results[w.name]
        rates = sorted({r.rate for r in rows if r.rate is not None})
        labels = list(dict.fromkeys(r.label for r in rows))
        out += [f"**{w.name}** ({w.what}), TTFT p90:", ""]
        out.append("| policy | " + " | ".join(f"{rate:g} req/s" for rate in rates) + " |")
        out.append("|---|" + "---|" * len(rates))
        for label in labels:
            cells = []
            for rate in rates:
                row = next(r for r in rows if r.label == label and r.rate == rate)
                s = row.summary
                cell = _fmt_s(s.ttft_s.p90)
                if s.throughput_rps < 0.9 * rate:  # not keeping up: say how much it served
                    cell += f" ({s.throughput_rps:.0f}/s)"
                cells.append(f"**{cell}**" if label == PICKER else cell)
            out.append(f"| {label} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["| workload | req/s | picker p90 | best other (p90) | best / picker | rr / picker | lowest |"]
    out.append("|---|---|---|---|---|---|---|")
    for r in rs:
        out.append(
            f"| {r.workload} | {r.rate:g} | {_fmt_s(r.picker_p90_s)} | "
            f"{r.best_baseline} ({_fmt_s(r.best_baseline_p90_s)}) | {r.vs_best:.2f}x | {r.vs_rr:.1f}x | "
            f"{'yes' if r.lowest else 'no'} |"
        )
    return "\n".join(out) + "\n"


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _print_ratios(rows: Sequence[Ratio]) -> None:
    if not rows:
        return
    print("\npicker's default, p90 TTFT: vs the best other policy (>1 = picker lower) and vs round robin")
    print(f"  {'workload':<14} {'req/s':>6} {'picker':>9} {'best other':>24} {'vs best':>8} {'vs rr':>8}  lowest")
    for r in rows:
        best = f"{r.best_baseline} {r.best_baseline_p90_s * 1e3:.0f} ms"
        print(
            f"  {r.workload:<14} {r.rate:>6g} {r.picker_p90_s * 1e3:>6.0f} ms {best:>24} {r.vs_best:>7.2f}x "
            f"{r.vs_rr:>7.2f}x  {'yes' if r.lowest else 'no'}"
        )
