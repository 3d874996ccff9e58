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

What makes a long run stand for a much longer one (each optional): ``--fresh-ips`` gives every created pod a new
loopback address with a server of its own (as Kubernetes gives a new pod a new IP), so every per-endpoint map and
labelled series sees an endless stream of endpoints; ``--distinct-prompts`` makes every prompt new (the prefix
index fills to its bound); ``--replicas 2`` runs two pickers exchanging state (``--peers``); ``--tracing`` turns
tracing on, to a local OTLP sink, with every other request's trace sampled. ``--heap-dir DIR`` runs picker under
``tracemalloc`` and saves its top allocation sites (``/debug/pprof/heap``) every ``--heap-every``.

Goals (exit code 1 when one is missed): resident memory grows < 10 % from the end of the warm-up (the first
fifth of the run) to the end, and, when at least ``_SLOPE_MIN_WINDOW_S`` follow the warm-up, its least-squares
slope over them is under ``--max-rss-slope`` MB per hour (a shorter window is reported, not judged: RSS noise of a
megabyte or two would dominate it); open fds and asyncio tasks end no higher than after the warm-up plus a small
slack; in-flight leases are back to 0 once the load stops; no request failed. A table is printed; ``--png``
draws the samples over time.

    picker bench soak --duration 35m --rate 40 --churn-s 0.5 --fresh-ips --distinct-prompts --replicas 2 \
        --tracing --png soak.png                                                # the documented run
    picker bench soak --duration 2m --rate 20 --churn-s 3                     # the CI-sized run
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
MAX_RSS_SLOPE_MB_H = 5.0  # after the warm-up; a 512 MiB pod at ~130 MB would last > 3 days even at this slope
_SLOPE_MIN_WINDOW_S = 600.0
_DRAIN_S = 5.0  # a deleted pod's server keeps answering this long (requests routed just before the deletion)
_TRACE_SAMPLED = "00-{:032x}-{:016x}-01"
_TRACE_UNSAMPLED = "00-{:032x}-{:016x}-00"
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
    fresh_ips: bool = False  # every created pod on a new loopback address
    distinct_prompts: bool = False
    replicas: int = 1  # 2+: active-active pickers with --peers
    tracing: bool = False
    heap_dir: Path | None = None  # tracemalloc snapshots of picker (the first replica)
    heap_every_s: float = 300.0
    heap_frames: int = 1  # stack depth recorded; above 1 the snapshots group by whole stacks
    max_rss_slope_mb_h: float = MAX_RSS_SLOPE_MB_H


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

    def rss_slope_mb_h(self, since_s: float | None = None) -> tuple[float, float] | None:
        """Least-squares slope of RSS (MB per hour) over the samples from ``since_s`` (default the warm-up's end),
        and the window's length in seconds; None with fewer than 3 samples."""
        since = self.warm().t_s if since_s is None else since_s
        points = [(s.t_s, s.rss_mb) for s in self.samples if s.t_s >= since]
        if len(points) < 3:
            return None
        mean_t = statistics.fmean(t for t, _ in points)
        mean_r = statistics.fmean(r for _, r in points)
        var = sum((t - mean_t) ** 2 for t, _ in points)
        if var <= 0:
            return None
        slope_per_s = sum((t - mean_t) * (r - mean_r) for t, r in points) / var
        return slope_per_s * 3600.0, points[-1][0] - points[0][0]

    def checks(self) -> list[tuple[str, str, bool]]:
        if not self.samples:
            return [("samples", "none taken", False)]
        warm, last = self.warm(), self.samples[-1]
        growth = (last.rss_mb - warm.rss_mb) / warm.rss_mb
        out = [
            ("RSS growth after warm-up", f"{warm.rss_mb:.1f} → {last.rss_mb:.1f} MB ({growth:+.1%})", growth < 0.1),
            ("open fds", f"{warm.fds} → {last.fds}", last.fds <= warm.fds + _SLACK_FDS),
            ("asyncio tasks", f"{warm.tasks} → {last.tasks}", last.tasks <= warm.tasks + _SLACK_TASKS),
            ("in-flight leases after the load", str(self.final_leases), self.final_leases == 0),
            ("failed requests", f"{self.errors} of {self.requests}", self.errors == 0 and self.requests > 0),
        ]
        fit = self.rss_slope_mb_h()
        if fit is not None:
            slope, window_s = fit
            limit = self.spec.max_rss_slope_mb_h
            judged = window_s >= _SLOPE_MIN_WINDOW_S
            value = f"{slope:+.2f} MB/hour over {window_s / 60:.0f} min"
            half = self.rss_slope_mb_h(self.spec.duration_s / 2)
            if half is not None:
                value += f" (second half {half[0]:+.2f} MB/hour)"
            if judged:
                out.insert(1, (f"RSS slope after warm-up (goal < {limit:g} MB/hour)", value, slope < limit))
            else:
                out.insert(1, ("RSS slope after warm-up (window too short to judge)", value, True))
        return out

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
    parser.add_argument("--fresh-ips", action="store_true", help="every created pod on a new loopback address")
    parser.add_argument("--distinct-prompts", action="store_true", help="every prompt new (fills the prefix index)")
    parser.add_argument("--replicas", type=units.at_least(1), default=spec.replicas, help="2+: pickers with --peers")
    parser.add_argument("--tracing", action="store_true", help="tracing on (local OTLP sink), half the traces sampled")
    parser.add_argument("--heap-dir", type=Path, help="picker under tracemalloc: save its top allocation sites here")
    parser.add_argument("--heap-every", type=units.duration_arg, default=spec.heap_every_s)
    parser.add_argument("--heap-frames", type=units.at_least(1), default=spec.heap_frames, help="stack depth traced")
    parser.add_argument(
        "--max-rss-slope", type=float, default=spec.max_rss_slope_mb_h, help="MB/hour after the warm-up (judged "
        f"when at least {_SLOPE_MIN_WINDOW_S / 60:g} min follow it)"
    )  # fmt: skip
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
        fresh_ips=args.fresh_ips,
        distinct_prompts=args.distinct_prompts,
        replicas=args.replicas,
        tracing=args.tracing,
        heap_dir=args.heap_dir,
        heap_every_s=args.heap_every,
        heap_frames=args.heap_frames,
        max_rss_slope_mb_h=args.max_rss_slope,
    )
    report = asyncio.run(soak(spec))
    print(report.table())
    if args.png:
        plot(report, args.png)
        print(f"plot: {args.png}")
    if args.json:
        doc = {
            "spec": {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(spec).items()},
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
        async with http.get(self.url, timeout=aiohttp.ClientTimeout(total=60)) as resp:  # heap snapshots stall it
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


def _fresh_host(n: int) -> str:
    """The ``n``-th new pod address: 127.1.0.2, 127.1.0.3, … (loopback, outside the initial slots' range)."""
    return f"127.{1 + n // 64_000}.{(n % 64_000) // 250}.{n % 250 + 2}"


@contextlib.asynccontextmanager
async def _otlp_sink() -> AsyncIterator[int]:
    """An OTLP/gRPC trace endpoint that accepts and drops every export (a collector's part in the soak)."""
    import grpc

    async def export(_request: bytes, _context: object) -> bytes:
        return b""  # an empty ExportTraceServiceResponse

    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(0)


@dataclass
class _Replica:
    grpc_port: int = field(default_factory=procs.free_port)
    health_port: int = field(default_factory=procs.free_port)
    metrics_port: int = field(default_factory=procs.free_port)
    peer_port: int = field(default_factory=procs.free_port)


async def _start_pickers(
    stack: contextlib.AsyncExitStack, spec: SoakSpec, kubeconfig: Path
) -> tuple[list[_Replica], list[procs.Child]]:
    replicas = [_Replica() for _ in range(spec.replicas)]
    common: list[str] = []
    env = dict(os.environ)
    if spec.replicas > 1:  # the peer exchange needs one certificate pair for every replica
        from picker.extproc import tls

        cert_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="picker-soak-tls-")))
        pair = tls.self_signed()
        (cert_dir / "tls.crt").write_bytes(pair.cert_pem)
        (cert_dir / "tls.key").write_bytes(pair.key_pem)
        common += ["--cert-path", str(cert_dir)]
    if spec.tracing:
        sink_port = await stack.enter_async_context(_otlp_sink())
        common += ["--tracing"]
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{sink_port}", OTEL_EXPORTER_OTLP_INSECURE="true")
    children = []
    for i, r in enumerate(replicas):
        argv = [
            *procs.picker_command(), "serve", "--host", "127.0.0.1", "--pool-name", "pool",
            "--kubeconfig", str(kubeconfig), "--grpc-port", str(r.grpc_port), "--grpc-health-port",
            str(r.health_port), "--metrics-port", str(r.metrics_port), "--grace-period", "0s", *common,
        ]  # fmt: skip
        if spec.replicas > 1:
            others = ",".join(f"127.0.0.1:{o.peer_port}" for o in replicas if o is not r)
            argv += ["--peers", others, "--peer-port", str(r.peer_port)]
        child_env = env
        if i == 0 and spec.heap_dir is not None:
            argv += ["--enable-pprof"]
            child_env = {**env, "PYTHONTRACEMALLOC": str(spec.heap_frames)}
        children.append(await stack.enter_async_context(procs.spawn(f"picker-{i}", argv, env=child_env)))
    for r, child in zip(replicas, children, strict=True):
        await child.wait_http(f"http://127.0.0.1:{r.metrics_port}/metrics", 30)
    return replicas, children


async def soak(spec: SoakSpec) -> SoakReport:
    rng = random.Random(spec.seed)
    hosts = [f"127.0.0.{i}" for i in range(2, 2 + spec.pods)]
    port = procutil.free_ports(1, hosts=hosts)[0]
    report = SoakReport(spec)
    window = {"requests": 0, "errors": 0}
    async with contextlib.AsyncExitStack() as stack:
        engine = preset("h100-8b")
        servers: dict[str, SimServer] = {}  # pod name -> its server (--fresh-ips: one per pod)
        draining: set[asyncio.Task[None]] = set()

        async def serve(host: str, name: str) -> SimServer:
            sim = SimServer(engine, ServerConfig(host=host, port=port, name=name))
            await sim.start()
            return sim

        async def drain(sim: SimServer) -> None:
            await asyncio.sleep(_DRAIN_S)
            await sim.stop()

        slot_servers = [await serve(h, f"slot{i}") for i, h in enumerate(hosts)]
        for sim in slot_servers:
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
        replicas, pickers = await _start_pickers(stack, spec, kubeconfig)
        picker = pickers[0]
        listen_port, admin_port = procs.free_port(), procs.free_port()
        config = envoy.render(
            listen_port=listen_port,
            admin_port=admin_port,
            picker_port=replicas[0].grpc_port,
            extra_picker_ports=tuple(r.grpc_port for r in replicas[1:]),
            backends=[(h, port) for h in hosts],
        )
        await stack.enter_async_context(envoy.run_envoy(config, admin_port))
        http = await stack.enter_async_context(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        metrics = _Metrics(f"http://127.0.0.1:{replicas[0].metrics_port}/metrics")
        url = f"http://127.0.0.1:{listen_port}/v1/completions"
        stop = asyncio.Event()
        in_flight: set[asyncio.Task[None]] = set()

        async def one(i: int) -> None:
            prompt = f"soak request {i if spec.distinct_prompts else i % 97}: summarise the day"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": spec.max_tokens}
            headers = {}
            if spec.tracing:
                form = _TRACE_SAMPLED if i % 2 else _TRACE_UNSAMPLED
                headers["traceparent"] = form.format(rng.getrandbits(128) | 1, rng.getrandbits(64) | 1)
            ok = False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with http.post(url, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=30)) as resp:
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
                    name = members.pop(slot)
                    api.delete("pods", name)
                    gone = servers.pop(name, None)
                    if gone is not None:
                        task = asyncio.create_task(drain(gone))
                        draining.add(task)
                        task.add_done_callback(draining.discard)
                else:
                    slot = rng.choice([s for s in range(spec.pods) if s not in members])
                    generation += 1
                    name = members[slot] = f"pod-{slot}-{generation}"
                    host = hosts[slot]
                    if spec.fresh_ips:
                        host = _fresh_host(generation)
                        servers[name] = await serve(host, name)
                    api.create("pods", _pod(name, host))
                report.churn_events += 1

        async def heap_snapshots(began: float) -> None:
            assert spec.heap_dir is not None
            spec.heap_dir.mkdir(parents=True, exist_ok=True)
            heap_url = (
                f"http://127.0.0.1:{replicas[0].metrics_port}/debug/pprof/heap?limit=200"
                f"&traceback={int(spec.heap_frames > 1)}"
            )
            n = 0
            while not stop.is_set():
                async with http.get(heap_url, timeout=aiohttp.ClientTimeout(total=120)) as resp:
                    text = await resp.text()
                rss_mb, _ = _proc_stats(picker.pid)
                minute = (time.monotonic() - began) / 60
                header = f"t_min {minute:.1f} rss_mb {rss_mb:.1f}\n"
                (spec.heap_dir / f"heap-{n:03d}.txt").write_text(header + text)
                n += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), spec.heap_every_s)

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
        if spec.heap_dir is not None:
            workers.append(asyncio.create_task(heap_snapshots(began)))
        try:
            while time.monotonic() - began < spec.duration_s:
                await asyncio.sleep(min(spec.sample_s, max(0.0, spec.duration_s - (time.monotonic() - began))))
                await sample(began)
        finally:
            stop.set()
            await asyncio.gather(*workers)
            if in_flight:
                await asyncio.wait(in_flight, timeout=35)
            if draining:
                await asyncio.wait(draining, timeout=_DRAIN_S + 5)
            for sim in servers.values():
                await sim.stop()
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
