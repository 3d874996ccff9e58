"""``picker load``: drive a workload at an OpenAI-compatible URL and report TTFT/TPOT, throughput, Little's law.

    picker load --url http://127.0.0.1:8000 --workload shared-prefix --rate 5 --requests 200
    picker load --workload short-long --concurrency 4 --duration 30 --json out.json --plot out.png
    picker load --workload sharegpt --rate 2,4,8,16 --requests 100 --plot sweep.png    # one stage per rate
    picker load --workload fixed --fixed 512 --concurrency 1 --requests 3              # the seed's long stream

The logic lives in ``load`` (run_load), ``workloads`` and ``report``; this module only parses flags.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

from picker.bench import flags
from picker.bench import workloads as wl
from picker.bench.load import LoadResult, LoadSpec, RequestRecord, merge_results, run_load
from picker.bench.report import plot, print_summary, summarize, to_json
from picker.scheduling import units

__all__ = ["WORKLOADS", "build_workload", "configure", "run"]

WORKLOADS = ("shared-prefix", "multi-turn", "short-long", "seed-mix", "sharegpt", "fixed")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:8000",
        help="base URL (the server or the gateway); a comma list loads each URL at once (rate, concurrency and "
        "--requests are per URL) and reports the merged records",
    )
    parser.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    parser.add_argument("--api", choices=("completions", "chat"), default="completions")
    parser.add_argument("--no-stream", dest="stream", action="store_false", help="non-streaming requests")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--rate", help="Poisson arrival rate in req/s; a comma list runs one stage per rate")
    load.add_argument("--concurrency", help="closed-loop concurrency; a comma list runs one stage per level")
    parser.add_argument("--requests", type=units.at_least(1), default=100, help="request cap per stage (default 100)")
    parser.add_argument("--duration", type=units.above(0), default=60.0, help="seconds cap per stage (default 60)")
    parser.add_argument(
        "--drain-s", type=units.at_least(0.0, float), default=30.0, help="wait this long for in-flight at the end"
    )
    parser.add_argument("--timeout-s", type=units.above(0), default=120.0, help="per-request timeout")
    parser.add_argument("--header", action="append", default=[], metavar="K:V", help="extra request header")
    parser.add_argument("--seed", type=int, default=0)

    add_workload_arguments(parser.add_argument_group("workload"), WorkloadDefaults())

    o = parser.add_argument_group("output")
    o.add_argument("--json", type=Path, help="write summary + per-request records as JSON")
    o.add_argument("--plot", type=Path, help="write a PNG (TTFT/TPOT distributions, latency vs load)")
    o.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")


@dataclass(frozen=True)
class WorkloadDefaults:
    """The workload flags' defaults: ``picker load``'s; ``picker bench lab`` runs larger ones."""

    workload: str = "sharegpt"
    groups: int = 8
    prompts_per_group: int = 8
    system_len: int = 512
    sessions: int = 8
    lora_help: str = "comma-separated adapters: each request goes to one of them"


def add_workload_arguments(w: argparse._ArgumentGroup, d: WorkloadDefaults) -> None:
    """The flags ``build_workload`` reads (``picker load``, ``picker bench lab``)."""
    count = tokens = units.at_least(1)
    w.add_argument("--workload", choices=WORKLOADS, default=d.workload)
    w.add_argument("--fixed", type=count, metavar="N", help="every answer exactly N tokens (ignore_eos)")
    w.add_argument("--groups", type=count, default=d.groups, help="shared-prefix: groups")
    w.add_argument(
        "--prompts-per-group", type=count, default=d.prompts_per_group, help="shared-prefix: prompts per group"
    )
    w.add_argument(
        "--system-len", type=tokens, default=d.system_len, help="shared-prefix / multi-turn: system prompt tokens"
    )
    w.add_argument("--question-len", type=tokens, default=64, help="shared-prefix / multi-turn: question tokens")
    w.add_argument("--output-len", type=tokens, default=64, help="answer tokens (shared-prefix, multi-turn, fixed)")
    w.add_argument("--sessions", type=count, default=d.sessions, help="multi-turn: concurrent sessions")
    w.add_argument("--turns", type=count, default=4, help="multi-turn: turns per session")
    w.add_argument("--answer-len", type=tokens, default=64, help="multi-turn: synthetic answer tokens in history")
    w.add_argument("--prompt-len", type=tokens, default=256, help="fixed: prompt tokens")
    w.add_argument("--long-fraction", type=units.fraction, default=0.2, help="short-long: share of 512-token streams")
    w.add_argument("--lora", help=d.lora_help)
    w.add_argument("--lora-weights", help="comma-separated weights for --lora (e.g. 60,30,10)")


def build_workload(args: argparse.Namespace) -> wl.Workload:
    name, seed = args.workload, args.seed
    workload: wl.Workload
    if name == "shared-prefix":
        workload = wl.shared_prefix(
            num_groups=args.groups,
            prompts_per_group=args.prompts_per_group,
            system_prompt_len=args.system_len,
            question_len=args.question_len,
            output_len=args.output_len,
            seed=seed,
        )
    elif name == "multi-turn":
        workload = wl.multi_turn_chat(
            sessions=args.sessions,
            turns=args.turns,
            system_prompt_len=args.system_len,
            question_len=args.question_len,
            answer_len=args.answer_len,
            output_len=args.output_len,
            seed=seed,
        )
    elif name == "short-long":
        workload = wl.short_long(long_fraction=args.long_fraction, seed=seed)
    elif name == "seed-mix":
        workload = wl.seed_mix(seed=seed)
    elif name == "sharegpt":
        workload = wl.sharegpt_like(seed=seed)
    else:
        workload = wl.fixed_lengths(prompt_len=args.prompt_len, output_len=args.output_len, seed=seed)
    if args.lora:
        adapters = flags.names(args.lora)
        weights = flags.numbers(args.lora_weights, "--lora-weights", float, least=0) if args.lora_weights else None
        workload = wl.multi_lora(workload, adapters, weights, seed=seed)
    if args.fixed is not None:
        workload = wl.with_fixed(workload, args.fixed)
    return workload


def _stages(args: argparse.Namespace) -> list[tuple[float | None, int | None]]:
    if args.concurrency:
        return [(None, c) for c in flags.numbers(args.concurrency, "--concurrency", int, least=1)]
    return [(r, None) for r in flags.numbers(args.rate or "1", "--rate", float, above=0)]


def _headers(raw: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for h in raw:
        key, sep, value = h.partition(":")
        if not sep or not key.strip():
            raise ValueError(f"--header wants K:V, got {h!r}")
        out.append((key.strip(), value.strip()))
    return tuple(out)


async def _run_stages(args: argparse.Namespace, workload: wl.Workload) -> list[LoadResult]:
    results: list[LoadResult] = []
    headers = _headers(args.header)
    show = args.progress and sys.stdout.isatty()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for rate, concurrency in _stages(args):
            spec = LoadSpec(
                rate=rate,
                concurrency=concurrency,
                max_requests=args.requests,
                max_duration_s=args.duration,
                drain_s=args.drain_s,
                timeout_s=args.timeout_s,
                api=args.api,
                model=args.model,
                stream=args.stream,
                seed=args.seed,
                headers=headers,
            )
            urls = flags.names(args.url)
            if show and len(urls) == 1:
                result = await _with_progress(urls[0], workload, spec, session)
            else:
                runs = [run_load(u, workload, spec, session=session, workload_name=workload.name) for u in urls]
                result = merge_results(await asyncio.gather(*runs))
            print_summary(summarize(result))
            results.append(result)
    return results


async def _with_progress(url: str, workload: wl.Workload, spec: LoadSpec, session: aiohttp.ClientSession) -> LoadResult:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        mode = f"rate {spec.rate:g}/s" if spec.rate is not None else f"concurrency {spec.concurrency}"
        task = progress.add_task(f"{workload.name} {mode}", total=spec.max_requests)
        on_record: Callable[[RequestRecord], None] = lambda _rec: progress.advance(task)  # noqa: E731
        return await run_load(url, workload, spec, session=session, on_record=on_record, workload_name=workload.name)


def run(args: argparse.Namespace) -> int:
    try:
        workload = build_workload(args)
        _stages(args)
        _headers(args.header)
    except ValueError as exc:
        print(f"picker load: {exc}", file=sys.stderr)
        return 2
    try:
        results = asyncio.run(_run_stages(args, workload))
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        print(f"picker load: {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        doc = [to_json(r, summarize(r)) for r in results]
        args.json.write_bytes(orjson.dumps(doc[0] if len(doc) == 1 else {"stages": doc}, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    if args.plot:
        plot(results, args.plot)
        print(f"wrote {args.plot}")
    return 0 if all(summarize(r).ok for r in results) else 1
