"""``picker demo --pd``: prefill/decode disaggregation live, through a real Envoy, against aggregated serving.

    picker demo --pd            # ~2 minutes: two phases of ~45 s, a side-by-side table, picker-demo-pd.png
    picker demo --pd --short    # ~40 s (CI)

Both phases run the same long-prompt workload (3072-token prompts, 128-token answers, seeded) through Envoy with
picker as its ext_proc processor (TLS, ``FULL_DUPLEX_STREAMED``), and picker runs llm-d's P/D sample
configuration unchanged (``lab_pd.PD_CONFIG_TEXT``: prefix 2 + queue 1 behind the role filters,
``prefix-based-pd-decider`` with ``nonCachedTokens`` 16, ``disagg-profile-handler``):

1. **aggregated**: four simulated ``h100-8b`` servers without roles; the sample routes decode-only;
2. **P/D** (``--pd-fleet``, default ``2p2d``): two servers labelled ``llm-d.ai/role: prefill`` and two labelled
   ``decode``, each decode server behind llm-d's routing sidecar (``picker.sim.sidecar``, its SSRF allowlist the
   prefill servers). picker sends each request to a decode pod's sidecar with ``x-prefiller-host-port``; the
   sidecar has the prompt prefilled there, then the decode server pulls its KV (100 Gb/s) and streams the answer.

The demo fails (exit 1) if any request fails. What to expect (docs/disaggregation.md): P/D keeps decoding free of
3072-token prefills, so TPOT p90 drops to the decode step; TTFT pays the KV transfer and the extra hop.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from picker.bench import demo, envoy, lab_pd, lab_report, procs
from picker.bench import stack as stack_procs
from picker.bench import workloads as wl
from picker.bench.lab_pd import Fleet
from picker.bench.load import LoadResult, run_load
from picker.bench.report import Dist

__all__ = ["PdDemoPlan", "plan_from_args", "run"]

AGGREGATED, DISAGGREGATED = "aggregated", "P/D"
FULL_DURATION_S, SHORT_DURATION_S = 45.0, 15.0
DECISIONS = "llm_d_inference_scheduler_disagg_decision"


@dataclass(frozen=True, slots=True)
class PdDemoPlan:
    fleet: str = "2p2d"
    rate: float = 2.0
    duration_s: float = FULL_DURATION_S
    requests: int = 1000  # cap; the duration ends the phase first
    prompt_len: int = 3072
    output_len: int = 128
    seed: int = 0
    scrape_interval: str = "50ms"


@dataclass(slots=True)
class _Phase:
    label: str
    result: LoadResult
    servers: list[str]  # display names, in order
    stats: dict[str, dict[str, Any]]  # display name -> the server's /admin/stats
    decisions: dict[str, float]  # decision_type -> count (picker's llm-d metric)


def plan_from_args(args: argparse.Namespace) -> PdDemoPlan:
    d = PdDemoPlan()
    duration = args.duration if args.duration is not None else (SHORT_DURATION_S if args.short else FULL_DURATION_S)
    rate = args.rate if args.rate is not None else d.rate
    fleet = Fleet.parse(args.pd_fleet)
    if not fleet.disaggregated or fleet.roles.count("prefill") < 1:
        raise ValueError("--pd-fleet needs prefill and decode servers, e.g. 2p2d")
    if rate <= 0 or duration <= 0:
        raise ValueError("need a positive --rate and --duration")
    return PdDemoPlan(fleet=fleet.name, rate=rate, duration_s=duration, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    try:
        plan = plan_from_args(args)
        envoy_bin = envoy.envoy_binary()
    except (ValueError, envoy.EnvoyNotFound) as exc:
        print(f"picker demo --pd: {exc}", file=sys.stderr)
        return 2
    fleet = Fleet.parse(plan.fleet)
    workload = wl.with_fixed(
        wl.fixed_lengths(prompt_len=plan.prompt_len, output_len=plan.output_len, seed=plan.seed), plan.output_len
    )
    print(
        f"picker demo --pd: {fleet.engines} simulated h100-8b servers aggregated, then as {plan.fleet} "
        f"(prefill/decode, llm-d's routing sidecar in front of each decode server), picker with llm-d's P/D sample "
        f"config, a real "
        f"Envoy; {plan.prompt_len}-token prompts, {plan.output_len}-token answers at {plan.rate:g} req/s for "
        f"{plan.duration_s:g} s per phase",
        flush=True,
    )
    started = time.perf_counter()
    children: list[procs.Child] = []
    stopped = procs.Interrupt()
    try:
        phases = asyncio.run(_main(plan, fleet, workload, envoy_bin, children, stopped))
    except (procs.ChildFailed, KeyboardInterrupt, asyncio.CancelledError) as exc:
        if (signum := stopped.stopping_signal(exc)) is not None:
            print(f"picker demo --pd: {signal.Signals(signum).name}: stopped", file=sys.stderr)
            return 128 + signum
        print(f"picker demo --pd: {exc}", file=sys.stderr)
        return 1
    rows = [lab_report.make_row(p.label, p.result, p.servers) for p in phases]
    print()
    title = f"{plan.prompt_len}-token prompts, {plan.output_len}-token answers through Envoy at {plan.rate:g} req/s"
    lab_report.print_rows(title, rows)
    agg, pd = rows[0].summary, rows[1].summary
    decisions = phases[1].decisions
    stall_agg, stall_pd = (_max_itl_p90(p.result) for p in phases)
    print(
        f"P/D vs aggregated: worst gap between tokens (p90 over requests) {stall_agg * 1e3:.0f} -> "
        f"{stall_pd * 1e3:.0f} ms, TPOT p90 {agg.tpot_s.p90 * 1e3:.1f} -> {pd.tpot_s.p90 * 1e3:.1f} ms, TTFT p50 "
        f"{agg.ttft_s.p50 * 1e3:.0f} -> {pd.ttft_s.p50 * 1e3:.0f} ms, p90 {agg.ttft_s.p90 * 1e3:.0f} -> "
        f"{pd.ttft_s.p90 * 1e3:.0f} ms; picker's decisions {_decisions(decisions)}; prefill servers computed "
        f"{_prefilled(phases[1]):,} prompt tokens ({time.perf_counter() - started:.0f} s)"
    )
    if args.png is not None:
        png = args.png if args.png != Path("picker-demo.png") else Path("picker-demo-pd.png")
        lab_report.plot_rows(rows, png, f"picker demo --pd: {plan.fleet} vs {fleet.engines} aggregated, behind Envoy")
        print(f"wrote {png}")
    return stack_procs.finish(
        "picker demo --pd",
        rows,
        children,
        args.json,
        lambda: {
            "plan": {f: getattr(plan, f) for f in PdDemoPlan.__dataclass_fields__},
            "phases": [
                {
                    **lab_report.row_json(r),
                    "stats": p.stats,
                    "decisions": p.decisions,
                    "max_itl_p90_s": _max_itl_p90(p.result),
                }
                for r, p in zip(rows, phases, strict=True)
            ],
        },
    )


def _max_itl_p90(result: LoadResult) -> float:
    """p90 over the successful requests of each one's largest gap between two tokens (a prefill stall shows)."""
    return Dist.of([r.max_itl_s for r in result.records if r.ok and r.output_tokens > 1]).p90


def _decisions(decisions: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(decisions.items()) if v) or "none"


def _prefilled(phase: _Phase) -> int:
    return sum(int(s.get("prefix_queries_tokens", 0)) for name, s in phase.stats.items() if name.startswith("prefill"))


# -- the run ------------------------------------------------------------------------------------------------------


async def _main(
    plan: PdDemoPlan,
    fleet: Fleet,
    workload: wl.Workload,
    envoy_bin: str,
    children: list[procs.Child],
    stopped: procs.Interrupt,
) -> list[_Phase]:
    procs.cancel_on_signals(stopped)
    started = procs.announce_into(children)
    phases = []
    for i, (label, roles) in enumerate(((AGGREGATED, ("",) * fleet.engines), (DISAGGREGATED, fleet.roles))):
        print(f"phase {i + 1}/2: {label}", flush=True)
        phases.append(await _phase(label, roles, plan, workload, envoy_bin, started))
    return phases


@dataclass(frozen=True, slots=True)
class _Server:
    name: str  # display name: prefill-1, decode-2, server-3
    role: str
    port: int  # the simulated vLLM server
    sidecar: int  # its routing sidecar (decode servers of the P/D phase), else 0

    @property
    def endpoint_port(self) -> int:
        """The pool's target port: the sidecar in front of a decode server, else the server itself."""
        return self.sidecar or self.port


def _servers(roles: tuple[str, ...]) -> list[_Server]:
    out: list[_Server] = []
    counts: dict[str, int] = {}
    for role in roles:
        kind = role or "server"
        counts[kind] = counts.get(kind, 0) + 1
        sidecar = procs.free_port() if role in ("decode", "both") else 0
        out.append(_Server(f"{kind}-{counts[kind]}", role, procs.free_port(), sidecar))
    return out


async def _phase(
    label: str,
    roles: tuple[str, ...],
    plan: PdDemoPlan,
    workload: wl.Workload,
    envoy_bin: str,
    on_start: Callable[[procs.Child], None],
) -> _Phase:
    servers = _servers(roles)
    with tempfile.TemporaryDirectory(prefix="picker-demo-pd-") as tmp:
        config_file, endpoints_file = Path(tmp) / "pd-config.yaml", Path(tmp) / "endpoints.yaml"
        config_file.write_text(lab_pd.PD_CONFIG_TEXT.format(
            decider="- type: prefix-based-pd-decider\n  parameters:\n    nonCachedTokens: 16\n",
            decider_type="prefix-based-pd-decider",
        ))  # fmt: skip
        endpoints = [
            {"address": "127.0.0.1", "port": s.endpoint_port, "name": s.name, "labels": lab_pd.role_labels(s.role)}
            for s in servers
        ]
        endpoints_file.write_text(yaml.safe_dump({"endpoints": endpoints}))
        async with contextlib.AsyncExitStack() as stack:
            sims = await stack.enter_async_context(_sims(servers, plan, on_start))
            picker, picker_port, metrics_port = await stack.enter_async_context(
                _picker(config_file, endpoints_file, plan, on_start)
            )
            children = [*sims, picker]
            listen, admin = procs.free_port(), procs.free_port()
            config = envoy.render(
                listen_port=listen,
                admin_port=admin,
                picker_port=picker_port,
                backends=[("127.0.0.1", s.endpoint_port) for s in servers],
                body_mode="FULL_DUPLEX_STREAMED",
                picker_tls=True,
            )
            gateway = await stack.enter_async_context(envoy.run_envoy(config, admin, binary=envoy_bin))
            on_start(gateway)
            children.append(gateway)
            spec = demo.load_spec(plan)
            result = await stack_procs.watched(run_load(f"http://127.0.0.1:{listen}", workload, spec), children)
            stats = await _stats(servers)
            decisions = await _decision_counts(metrics_port)
            await stack_procs.stop_all(children)
    stack_procs.name_servers(result.records, {f"sim-{s.port}": s.name for s in servers})
    return _Phase(label, result, [s.name for s in servers], stats, decisions)


def _groups(servers: list[_Server]) -> list[list[_Server]]:
    """Servers by ``picker sim`` process: prefill servers in one, decode servers and their sidecars in another;
    servers without roles in two halves. Two processes in both phases, so both get the same CPU."""
    if any(s.role for s in servers):
        groups = [[s for s in servers if s.role == "prefill"], [s for s in servers if s.role != "prefill"]]
    else:
        half = (len(servers) + 1) // 2
        groups = [servers[:half], servers[half:]]
    return [g for g in groups if g]


@contextlib.asynccontextmanager
async def _sims(
    servers: list[_Server], plan: PdDemoPlan, on_start: Callable[[procs.Child], None]
) -> AsyncIterator[list[procs.Child]]:
    prefillers = ",".join(f"127.0.0.1:{s.port}" for s in servers if s.role in ("prefill", "both"))
    async with contextlib.AsyncExitStack() as stack:
        children = []
        for i, group in enumerate(_groups(servers)):
            argv = [*procs.picker_command(), "sim", "--preset", "h100-8b", "--seed", str(plan.seed)]
            argv += ["--ports", ",".join(str(s.port) for s in group)]
            if any(s.sidecar for s in group):
                argv += ["--sidecar-ports", ",".join(str(s.sidecar) for s in group), "--prefillers", prefillers]
            child = await stack.enter_async_context(procs.spawn(f"sims-{i + 1}", argv, on_start=on_start))
            for s in group:
                await child.wait_http(f"http://127.0.0.1:{s.endpoint_port}/health", 30.0)
            children.append(child)
        yield children


@contextlib.asynccontextmanager
async def _picker(
    config_file: Path, endpoints_file: Path, plan: PdDemoPlan, on_start: Callable[[procs.Child], None]
) -> AsyncIterator[tuple[procs.Child, int, int]]:
    grpc, health, metrics = procs.free_port(), procs.free_port(), procs.free_port()
    argv = [*procs.picker_command(), "serve", "--endpoints-file", str(endpoints_file)]
    argv += ["--config-file", str(config_file)]
    argv += ["--host", "127.0.0.1", "--grpc-port", str(grpc), "--grpc-health-port", str(health)]
    argv += ["--metrics-port", str(metrics), "--refresh-metrics-interval", plan.scrape_interval]
    argv += ["--grace-period", "0s", "--termination-grace", "2s", "--log-level", "warning"]
    async with procs.spawn("picker", argv, on_start=on_start) as child:
        await child.wait_http(f"http://127.0.0.1:{metrics}/metrics", 30.0)
        await asyncio.sleep(0.3)  # a few scrapes: picker has seen every server
        yield child, grpc, metrics


async def _stats(servers: list[_Server]) -> dict[str, dict[str, Any]]:
    """Each server's /admin/stats (straight to the server, not through its sidecar)."""
    out: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for s in servers:
            async with http.get(f"http://127.0.0.1:{s.port}/admin/stats") as resp:
                out[s.name] = await resp.json()
    return out


async def _decision_counts(metrics_port: int) -> dict[str, float]:
    """picker's llm_d_inference_scheduler_disagg_decision_total by decision type."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http, http.get(url) as resp:
        text = await resp.text()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == DECISIONS:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    kind = sample.labels.get("decision_type", "")
                    counts[kind] = counts.get(kind, 0.0) + sample.value
    return counts
