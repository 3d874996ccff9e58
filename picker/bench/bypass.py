"""``picker bench bypass``: picker follows load it did not route, live through the real Envoy.

    picker bench bypass                      # ~1 minute: two phases of 20 s, a table, optional JSON
    picker bench bypass --duration 10        # the CI-sized run (tests/e2e/test_live_bypass.py)

Two simulated ``h100-8b`` servers behind a real Envoy with picker as its ext_proc processor. A second client
sends requests straight to server-2, bypassing the gateway (a batch job, another gateway, a picker replica that
routes elsewhere): server-2 is busy with work picker never saw. The gateway's client sends distinct prompts (no
shared prefix, so only load tells the servers apart). Two phases, each with fresh servers and picker:

1. ``picker-v1``: picker's previous default (prefix + token load + LoRA on picker's own in-flight ledger);
2. ``default``: picker's built-in default, which adds what the servers report beyond picker's own requests.

For each phase: the gateway requests' share on each server, their TTFT, and the bypassing requests' TTFT. The
default should send most gateway traffic to the idle server-1; the previous default, blind to the bypass, splits
it evenly.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from picker.bench import envoy, procs
from picker.bench import stack as stack_procs
from picker.bench import workloads as wl
from picker.bench.load import LoadResult, LoadSpec, run_load
from picker.bench.policies import PREVIOUS_CONFIG_TEXT
from picker.bench.report import Summary, summarize

__all__ = ["BypassPlan", "PhaseResult", "configure", "run", "run_phases"]

PHASES = ("picker-v1", "default")
SERVERS = ("server-1", "server-2")


@dataclass(frozen=True, slots=True)
class BypassPlan:
    duration_s: float = 20.0  # gateway load per phase
    warmup_s: float = 3.0  # the bypassing client runs alone first: server-2 is busy when the gateway load starts
    gateway_rate: float = 6.0
    bypass_rate: float = 12.0  # server-2 alone is past its capacity: its queue grows (8: busy, no queue)
    num_gpu_blocks: int = 2048
    seed: int = 0
    scrape_interval: str = "50ms"


@dataclass(frozen=True, slots=True)
class PhaseResult:
    label: str
    gateway: Summary
    bypass: Summary
    shares: dict[str, float]  # server -> share of the gateway's successful requests


def configure(parser: argparse.ArgumentParser) -> None:
    d = BypassPlan()
    parser.add_argument("--duration", type=float, default=d.duration_s, help="seconds of gateway load per phase")
    parser.add_argument("--gateway-rate", type=float, default=d.gateway_rate, help="requests/s through Envoy")
    parser.add_argument("--bypass-rate", type=float, default=d.bypass_rate, help="requests/s straight to server-2")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--json", type=Path, help="write both phases' summaries and shares")


def run(args: argparse.Namespace) -> int:
    if args.duration <= 0 or args.gateway_rate <= 0 or args.bypass_rate <= 0:
        print("picker bench bypass: --duration and the rates must be > 0", file=sys.stderr)
        return 2
    plan = BypassPlan(
        duration_s=args.duration, gateway_rate=args.gateway_rate, bypass_rate=args.bypass_rate, seed=args.seed
    )
    try:
        envoy_bin = envoy.envoy_binary()
    except envoy.EnvoyNotFound as exc:
        print(f"picker bench bypass: {exc}", file=sys.stderr)
        return 2
    print(
        f"bypass: 2 simulated servers behind Envoy + picker; {plan.gateway_rate:g} req/s through the gateway, "
        f"{plan.bypass_rate:g} req/s straight to server-2; {plan.duration_s:g} s per phase",
        flush=True,
    )
    started = time.perf_counter()
    try:
        results = asyncio.run(run_phases(plan, envoy_bin))
    except procs.ChildFailed as exc:
        print(f"picker bench bypass: {exc}", file=sys.stderr)
        return 1
    print(f"\n{'phase':<10} {'gateway req':>11} {'failed':>6} {'on server-1':>11} {'TTFT p50':>9} {'p90':>8}"
          f" {'bypass TTFT p50':>16}")  # fmt: skip
    for r in results:
        g = r.gateway
        print(
            f"{r.label:<10} {g.requests:>11} {g.failed:>6} {r.shares.get(SERVERS[0], 0.0):>11.0%} "
            f"{g.ttft_s.p50 * 1e3:>6.0f} ms {g.ttft_s.p90 * 1e3:>5.0f} ms {r.bypass.ttft_s.p50 * 1e3:>13.0f} ms"
        )
    print(f"({time.perf_counter() - started:.0f} s)")
    if args.json is not None:
        doc = {
            "plan": {f: getattr(plan, f) for f in BypassPlan.__dataclass_fields__},
            "phases": [_phase_json(r) for r in results],
        }
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
        print(f"wrote {args.json}")
    failed = sum(r.gateway.failed + r.bypass.failed for r in results)
    if failed:
        print(f"picker bench bypass: {failed} requests failed", file=sys.stderr)
        return 1
    return 0


def _phase_json(r: PhaseResult) -> dict[str, Any]:
    def summary(s: Summary) -> dict[str, Any]:
        return {
            "requests": s.requests,
            "ok": s.ok,
            "failed": s.failed,
            "ttft_s": {"p50": s.ttft_s.p50, "p90": s.ttft_s.p90, "p99": s.ttft_s.p99},
            "backends": dict(s.backends),
        }

    return {"label": r.label, "gateway": summary(r.gateway), "bypass": summary(r.bypass), "shares": r.shares}


async def run_phases(plan: BypassPlan, envoy_bin: str) -> list[PhaseResult]:
    """Both phases, each with fresh servers, picker and Envoy."""
    out = []
    with tempfile.TemporaryDirectory(prefix="picker-bypass-") as tmp:
        previous = Path(tmp) / "picker-v1.yaml"
        previous.write_text(PREVIOUS_CONFIG_TEXT)
        for i, label in enumerate(PHASES):
            print(f"phase {i + 1}/{len(PHASES)}: {label}", flush=True)
            config = str(previous) if label == "picker-v1" else None
            out.append(await _phase(label, plan, envoy_bin, config))
    return out


async def _phase(label: str, plan: BypassPlan, envoy_bin: str, config_file: str | None) -> PhaseResult:
    ports = [procs.free_port() for _ in SERVERS]
    names = {f"sim-{p}": name for p, name in zip(ports, SERVERS, strict=True)}
    children: list[procs.Child] = []
    async with contextlib.AsyncExitStack() as stack:
        sims = await stack.enter_async_context(
            stack_procs.sims(ports, num_gpu_blocks=plan.num_gpu_blocks, seed=plan.seed, on_start=children.append)
        )
        _, picker_port = await stack.enter_async_context(
            stack_procs.picker_serve(
                ports, scrape_interval=plan.scrape_interval, on_start=children.append, config_file=config_file
            )
        )
        listen, admin = procs.free_port(), procs.free_port()
        config = envoy.render(
            listen_port=listen,
            admin_port=admin,
            picker_port=picker_port,
            backends=[("127.0.0.1", p) for p in ports],
            body_mode="FULL_DUPLEX_STREAMED",
            picker_tls=True,
            with_picker=True,
        )
        children.append(await stack.enter_async_context(envoy.run_envoy(config, admin, binary=envoy_bin)))
        # Long answers keep server-2 busy; distinct prompts on the gateway side leave load as the only signal.
        bypass_spec = LoadSpec(
            rate=plan.bypass_rate,
            max_requests=100_000,
            max_duration_s=plan.warmup_s + plan.duration_s,
            drain_s=30.0,
            timeout_s=60.0,
            seed=plan.seed + 1,
        )
        gateway_spec = LoadSpec(
            rate=plan.gateway_rate, max_requests=100_000, max_duration_s=plan.duration_s, drain_s=30.0,
            timeout_s=60.0, seed=plan.seed,
        )  # fmt: skip
        bypass_load = wl.fixed_lengths(prompt_len=512, output_len=256, seed=plan.seed + 1)
        gateway_load = wl.fixed_lengths(prompt_len=256, output_len=32, seed=plan.seed)
        bypass = asyncio.ensure_future(run_load(f"http://127.0.0.1:{ports[1]}", bypass_load, bypass_spec))
        try:
            await asyncio.sleep(plan.warmup_s)
            sims.check()
            gateway = await run_load(f"http://127.0.0.1:{listen}", gateway_load, gateway_spec)
            bypassed = await bypass
        finally:
            if not bypass.done():
                bypass.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await bypass
        for child in children:
            child.check()
    _rename(gateway, names)
    _rename(bypassed, names)
    g = summarize(gateway)
    total = sum(g.backends.values())
    shares = {name: (g.backends.get(name, 0) / total if total else 0.0) for name in SERVERS}
    return PhaseResult(label, g, summarize(bypassed), shares)


def _rename(result: LoadResult, names: dict[str, str]) -> None:
    for rec in result.records:
        if rec.backend is not None:
            rec.backend = names.get(rec.backend, rec.backend)
