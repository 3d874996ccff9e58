"""``picker bench soak``: a long steady run with endpoint churn, watching picker for leaks.

The stack: simulated vLLM pods (``picker sim``'s servers, in this process, each on its own loopback address and a
shared port), the stand-in Kubernetes API server (``picker.sim.apiserver``) holding an InferencePool and the pods,
``picker serve`` in pool mode (a process, TLS on ext_proc) reading them through a kubeconfig, and the real Envoy
in front (``picker.bench.envoy``, FULL_DUPLEX_STREAMED, response phases on). An open-loop client sends requests at
a steady rate; every ``--churn-s`` seconds one pod is deleted and another created, so the pool's membership keeps
changing while requests flow.

Every ``--sample-s`` seconds it records picker's resident memory and open file descriptors (from ``/proc``), and
from picker's own ``/metrics``: asyncio tasks, open ext_proc streams, in-flight leases and the scheduling
decision latency (mean over the interval, from ``inference_extension_scheduler_e2e_duration_seconds``).

Goals (exit code 1 when one is missed): resident memory grows < 10 % from the end of the warm-up (the first
fifth of the run) to the end; open fds and asyncio tasks end no higher than after the warm-up plus a small
slack; in-flight leases are back to 0 once the load stops; no request failed. A table is printed; ``--png``
draws the samples over time.

    picker bench soak --duration 30m --rate 20 --churn-s 3 --png soak.png     # the documented run
    picker bench soak --duration 2m --rate 20 --churn-s 3                    # the CI-sized run
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from picker import procutil
from picker.bench import envoy, procs
from picker.scheduling import units
from picker.sim.apiserver import FakeApiServer
from picker.sim.config import preset
from picker.sim.server import ServerConfig, SimServer

__all__ = ["Sample", "SoakReport", "SoakSpec", "configure", "run", "soak"]

MODEL = "sim-model"
_RSS_GROWTH_GOAL = 0.10
_SLACK_FDS = 16
_SLACK_TASKS = 16
_SCHED_HIST = "inference_extension_scheduler_e2e_duration_seconds"


@dataclass(frozen=True, slots=True)
class SoakSpec:
    duration_s: float = 1800.0
    rate: float = 20.0
    pods: int = 6  # pod slots; between 2 and this many are members at any time
    churn_s: float = 3.0
    sample_s: float = 5.0
    max_tokens: int = 16
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Sample:
    t_s: float
    rss_mb: float
    fds: int
    tasks: int
    streams: int
    leases: int
    decision_ms: float  # mean over the interval; nan when nothing was scheduled
    requests: int  # finished in the interval
    errors: int
    members: int


@dataclass
class SoakReport:
    spec: SoakSpec
    samples: list[Sample] = field(default_factory=list)
    requests: int = 0
    errors: int = 0
    churn_events: int = 0
    final_leases: int = -1

    def warm(self) -> Sample:
        """The first sample after the warm-up (a fifth of the run)."""
        cut = self.spec.duration_s / 5
        return next((s for s in self.samples if s.t_s >= cut), self.samples[0])

    def checks(self) -> list[tuple[str, str, bool]]:
        if not self.samples:
            return [("samples", "none taken", False)]
        warm, last = self.warm(), self.samples[-1]
        growth = (last.rss_mb - warm.rss_mb) / warm.rss_mb
        return [
            ("RSS growth after warm-up", f"{warm.rss_mb:.1f} → {last.rss_mb:.1f} MB ({growth:+.1%})", growth < 0.1),
            ("open fds", f"{warm.fds} → {last.fds}", last.fds <= warm.fds + _SLACK_FDS),
            ("asyncio tasks", f"{warm.tasks} → {last.tasks}", last.tasks <= warm.tasks + _SLACK_TASKS),
            ("in-flight leases after the load", str(self.final_leases), self.final_leases == 0),
            ("failed requests", f"{self.errors} of {self.requests}", self.errors == 0 and self.requests > 0),
        ]

    def ok(self) -> bool:
        return all(passed for _, _, passed in self.checks())

    def table(self) -> str:
        decisions = [s.decision_ms for s in self.samples if s.decision_ms == s.decision_ms]
        lines = [
            f"soak: {self.spec.duration_s:g} s at {self.spec.rate:g} req/s, churn every {self.spec.churn_s:g} s "
            f"({self.churn_events} pod changes), {self.requests} requests",
            "| check | value | goal met |",
            "|---|---|---|",
            *(f"| {name} | {value} | {'yes' if passed else 'NO'} |" for name, value, passed in self.checks()),
        ]
        if decisions:
            lines.append(
                f"| decision latency (mean per interval) | {min(decisions):.3f} to {max(decisions):.3f} ms, "
                f"median {statistics.median(decisions):.3f} ms | — |"
            )
        return "\n".join(lines)


def configure(parser: argparse.ArgumentParser) -> None:
    spec = SoakSpec()
    parser.add_argument("--duration", type=units.duration_arg, default=spec.duration_s, help="e.g. 30m, 2m")
    parser.add_argument("--rate", type=units.above(0), default=spec.rate, help="requests per second")
    parser.add_argument("--pods", type=units.at_least(2), default=spec.pods, help="pod slots (2..N members at a time)")
    parser.add_argument(
        "--churn-s", type=units.above(0), default=spec.churn_s, help="a pod deleted and one created this often"
    )
    parser.add_argument("--sample-s", type=units.above(0), default=spec.sample_s)
    parser.add_argument("--seed", type=int, default=spec.seed)
    parser.add_argument("--png", type=Path, help="plot the samples over time")
    parser.add_argument("--json", type=Path, help="write the samples and checks as JSON")


def run(args: argparse.Namespace) -> int:
    spec = SoakSpec(
        duration_s=args.duration,
        rate=args.rate,
        pods=args.pods,
        churn_s=args.churn_s,
        sample_s=args.sample_s,
        seed=args.seed,
    )
    report = asyncio.run(soak(spec))
    print(report.table())
    if args.png:
        plot(report, args.png)
        print(f"plot: {args.png}")
    if args.json:
        doc = {
            "spec": dataclasses.asdict(spec),
            "samples": [dataclasses.asdict(s) for s in report.samples],
            "checks": [{"check": n, "value": v, "ok": ok} for n, v, ok in report.checks()],
            "requests": report.requests,
            "errors": report.errors,
            "churn_events": report.churn_events,
        }
        args.json.write_text(json.dumps(doc, indent=1))
    return 0 if report.ok() else 1


# -- the run ---------------------------------------------------------------------------------------------------


def _pod(name: str, ip: str) -> dict[str, object]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"app": "sim"}},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]},
    }


@contextlib.asynccontextmanager
async def _kubeconfig(server: str) -> AsyncIterator[Path]:
    with tempfile.TemporaryDirectory(prefix="picker-soak-") as tmp:
        path = Path(tmp) / "kubeconfig"
        cluster = {"name": "soak", "cluster": {"server": server}}
        context = {"name": "soak", "context": {"cluster": "soak", "user": "picker"}}
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [cluster],
                    "users": [{"name": "picker", "user": {"token": "soak"}}],
                    "contexts": [context],
                    "current-context": "soak",
                }
            )
        )
        yield path


class _Metrics:
    def __init__(self, url: str) -> None:
        self.url = url
        self._sched = (0.0, 0.0)

    async def read(self, http: aiohttp.ClientSession) -> dict[str, float]:
        async with http.get(self.url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            text = await resp.text()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            values[name] = values.get(name, 0.0) + float(value)
        return values

    def decision_ms(self, values: dict[str, float]) -> float:
        total, count = values.get(_SCHED_HIST + "_sum", 0.0), values.get(_SCHED_HIST + "_count", 0.0)
        d_total, d_count = total - self._sched[0], count - self._sched[1]
        self._sched = (total, count)
        return d_total / d_count * 1000 if d_count > 0 else float("nan")


def _proc_stats(pid: int) -> tuple[float, int]:
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))


async def soak(spec: SoakSpec) -> SoakReport:
    rng = random.Random(spec.seed)
    hosts = [f"127.0.0.{i}" for i in range(2, 2 + spec.pods)]
    port = procutil.free_ports(1, hosts=hosts)[0]
    report = SoakReport(spec)
    window = {"requests": 0, "errors": 0}
    async with contextlib.AsyncExitStack() as stack:
        engine = preset("h100-8b")
        sims = [SimServer(engine, ServerConfig(host=h, port=port, name=f"slot{i}")) for i, h in enumerate(hosts)]
        for sim in sims:
            await sim.start()
            stack.push_async_callback(sim.stop)
        api = await stack.enter_async_context(FakeApiServer())
        api.create(
            "inferencepools",
            {
                "metadata": {"name": "pool", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "sim"}}, "targetPorts": [{"number": port}]},
            },
        )
        members: dict[int, str] = {}  # slot -> pod name
        generation = 0
        for slot, host in enumerate(hosts):
            members[slot] = f"pod-{slot}-0"
            api.create("pods", _pod(members[slot], host))
        kubeconfig = await stack.enter_async_context(_kubeconfig(api.url))
        grpc_port, health_port, metrics_port = procs.free_port(), procs.free_port(), procs.free_port()
        listen_port, admin_port = procs.free_port(), procs.free_port()
        argv = [
            *procs.picker_command(), "serve", "--host", "127.0.0.1", "--pool-name", "pool",
            "--kubeconfig", str(kubeconfig), "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port),
            "--metrics-port", str(metrics_port), "--grace-period", "0s",
        ]  # fmt: skip
        picker = await stack.enter_async_context(procs.spawn("picker", argv))
        await picker.wait_http(f"http://127.0.0.1:{metrics_port}/metrics", 30)
        config = envoy.render(
            listen_port=listen_port,
            admin_port=admin_port,
            picker_port=grpc_port,
            backends=[(h, port) for h in hosts],
        )
        await stack.enter_async_context(envoy.run_envoy(config, admin_port))
        http = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        metrics = _Metrics(f"http://127.0.0.1:{metrics_port}/metrics")
        url = f"http://127.0.0.1:{listen_port}/v1/completions"
        stop = asyncio.Event()
        in_flight: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            prompt = f"soak request {i % 97}: summarise the day"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": spec.max_tokens}
            ok = False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with http.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    await resp.read()
                    ok = resp.status == 200
            report.requests += 1
            window["requests"] += 1
            if not ok:
                report.errors += 1
                window["errors"] += 1

        async def load() -> None:
            loop = asyncio.get_running_loop()
            start, i = loop.time(), 0
            while not stop.is_set():
                task = asyncio.create_task(one(i))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                i += 1
                delay = start + i / spec.rate - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)

        async def churn() -> None:
            nonlocal generation
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), spec.churn_s)
                if stop.is_set():
                    return
                if len(members) > 2 and (len(members) == spec.pods or rng.random() < 0.5):
                    slot = rng.choice(sorted(members))
                    api.delete("pods", members.pop(slot))
                else:
                    slot = rng.choice([s for s in range(spec.pods) if s not in members])
                    generation += 1
                    members[slot] = f"pod-{slot}-{generation}"
                    api.create("pods", _pod(members[slot], hosts[slot]))
                report.churn_events += 1

        async def sample(began: float) -> None:
            values = await metrics.read(http)
            rss_mb, fds = _proc_stats(picker.pid)
            report.samples.append(
                Sample(
                    t_s=time.monotonic() - began,
                    rss_mb=rss_mb,
                    fds=fds,
                    tasks=int(values.get("picker_asyncio_tasks", 0)),
                    streams=int(values.get("picker_extproc_streams", 0)),
                    leases=int(values.get("picker_inflight_leases", 0)),
                    decision_ms=metrics.decision_ms(values),
                    requests=window["requests"],
                    errors=window["errors"],
                    members=len(members),
                )
            )
            window["requests"] = window["errors"] = 0

        await metrics.read(http)
        began = time.monotonic()
        workers = [asyncio.create_task(load()), asyncio.create_task(churn())]
        try:
            while time.monotonic() - began < spec.duration_s:
                await asyncio.sleep(min(spec.sample_s, max(0.0, spec.duration_s - (time.monotonic() - began))))
                await sample(began)
        finally:
            stop.set()
            await asyncio.gather(*workers)
            if in_flight:
                await asyncio.wait(in_flight, timeout=35)
        deadline = time.monotonic() + 10
        while True:  # leases are released as responses complete; give the last ones a moment
            values = await metrics.read(http)
            report.final_leases = int(values.get("picker_inflight_leases", -1))
            if report.final_leases == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        await sample(began)
    return report


def plot(report: SoakReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s.t_s / 60 for s in report.samples]
    panels = [
        ("RSS (MB)", [s.rss_mb for s in report.samples]),
        ("open fds", [s.fds for s in report.samples]),
        ("asyncio tasks", [s.tasks for s in report.samples]),
        ("in-flight leases", [s.leases for s in report.samples]),
        ("decision latency (ms, mean)", [s.decision_ms for s in report.samples]),
        ("pool members", [s.members for s in report.samples]),
    ]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2 * len(panels)), sharex=True)
    for ax, (label, values) in zip(axes, panels, strict=True):
        ax.plot(t, values, marker=".", linewidth=1)
        ax.set_ylabel(label, fontsize=8)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("minutes")
    spec = report.spec
    fig.suptitle(f"picker bench soak: {spec.rate:g} req/s, a pod change every {spec.churn_s:g} s", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
