"""The reliability suite's stack: simulated model servers (each its own process), picker (one or two processes), the
real Envoy (reference ext_proc config, TLS to picker, a JSON access log), an open-loop client, and the measures.

Everything a user runs is real here: ``picker serve`` and ``picker sim`` as processes (so a fault is a real
SIGKILL or SIGSTOP), Envoy 1.40 from PyPI, TLS on ext_proc. Kubernetes is the stand-in API server of
``tests/kube/apiserver.py`` (no kube-apiserver can run here; tools.md §6), reached through a kubeconfig.
Each simulated pod binds its own loopback address (127.0.0.2, .3, ...) on one shared port, as a pool's pods share
the target port.

What a scenario measures (``Row``): what the client saw (status counts), latency p50/p99 of successful requests,
requests lost (errors or timeouts seen by the client), and a recovery time, defined per scenario from Envoy's
access log (which upstream each request went to, when) — typically the time from the fault until the last
request that still went to the faulty endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import yaml

from picker import procutil
from picker.bench import envoy as envoy_config
from picker.bench import procs

MODEL = "sim-model"
PROMPT = "Summarise the reliability report of the cluster in three sentences, please."


def shared_port(hosts: Sequence[str]) -> int:
    """A port free on every one of ``hosts``."""
    return procutil.free_ports(1, hosts=hosts)[0]


@dataclass
class Sim:
    """One simulated vLLM server in its own process (``picker sim``)."""

    name: str
    host: str
    port: int
    args: tuple[str, ...] = ()
    child: procs.Child | None = None
    _stack: contextlib.AsyncExitStack | None = None

    @property
    def key(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.key}"

    async def start(self, *, wait: bool = True) -> None:
        argv = [*procs.picker_command(), "sim", "--host", self.host, "--port", str(self.port), *self.args]
        self._stack = contextlib.AsyncExitStack()
        self.child = await self._stack.enter_async_context(procs.spawn(f"sim-{self.name}", argv, stop_timeout_s=3))
        if wait:
            await self.child.wait_http(self.url + "/health", 30)

    async def stop(self) -> None:
        if self.child is not None and self.child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.child.pid, signal.SIGCONT)  # a stopped process cannot handle SIGTERM
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None

    def signal(self, sig: int) -> None:
        assert self.child is not None
        os.kill(self.child.pid, sig)

    async def faults(self, **changes: object) -> None:
        async with aiohttp.ClientSession() as http, http.post(self.url + "/admin/faults", json=changes) as resp:
            assert resp.status == 200, await resp.text()


@dataclass
class Picker:
    grpc_port: int
    health_port: int
    metrics_port: int
    args: tuple[str, ...] = ()
    child: procs.Child | None = None
    _stack: contextlib.AsyncExitStack | None = None

    async def start(self) -> None:
        argv = [
            *procs.picker_command(), "serve", "--host", "127.0.0.1", "--grpc-port", str(self.grpc_port),
            "--grpc-health-port", str(self.health_port), "--metrics-port", str(self.metrics_port),
            "--grace-period", "0s", "--termination-grace", "2s", *self.args,
        ]  # fmt: skip
        self._stack = contextlib.AsyncExitStack()
        self.child = await self._stack.enter_async_context(procs.spawn("picker", argv, stop_timeout_s=5))
        await self.child.wait_http(f"http://127.0.0.1:{self.metrics_port}/metrics", 30)

    async def stop(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = None

    def kill(self) -> None:
        assert self.child is not None
        self.child.stopping = True
        os.kill(self.child.pid, signal.SIGKILL)

    def rss_bytes(self) -> int:
        assert self.child is not None
        with open(f"/proc/{self.child.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    async def metric(self, name: str, contains: str = "") -> float:
        """Sum of the samples of ``name`` on picker's /metrics (those whose line contains ``contains``)."""
        async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            text = await r.text()
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and line[len(name)] in " {" and contains in line:
                total += float(line.rsplit(" ", 1)[1])
        return total


@dataclass
class Result:
    sent: float  # wall clock (time.time()), comparable with Envoy's access log
    latency_s: float
    status: int  # 0: no HTTP answer (connection error or client timeout)
    backend: str = ""  # x-backend of the server that answered
    tag: str = ""  # what the load's ``tag`` function said of this request (e.g. its objective)
    retry_after: str | None = None


@dataclass
class Access:
    start: float
    cluster: str
    upstream: str
    code: int
    flags: str
    details: str = ""  # %RESPONSE_CODE_DETAILS%


@dataclass
class Stack:
    sims: list[Sim]
    pickers: list[Picker]
    url: str
    access_log: Path
    port: int  # the pods' shared port
    tmp: Path

    def accesses(self) -> list[Access]:
        out: list[Access] = []
        if not self.access_log.exists():
            return out
        for line in self.access_log.read_text().splitlines():
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            out.append(
                Access(
                    float(entry["start"]),
                    str(entry.get("cluster") or ""),
                    str(entry.get("upstream") or ""),
                    int(entry.get("code") or 0),
                    str(entry.get("flags") or ""),
                    str(entry.get("details") or ""),
                )
            )
        return out


POD_HOSTS = [f"127.0.0.{i}" for i in range(2, 12)]
# Flags added to every picker a stack starts (report.py --picker-arg: e.g. a row without hung-server detection).
EXTRA_PICKER_ARGS: list[str] = []


@contextlib.asynccontextmanager
async def stack(
    *,
    sims: int = 3,
    sim_args: Sequence[str] = ("--preset", "h100-8b"),
    per_sim_args: dict[int, Sequence[str]] | None = None,
    picker_args: Sequence[str] = (),
    pickers: int = 1,
    body_mode: str = "FULL_DUPLEX_STREAMED",
    failure_mode_allow: bool = False,
    endpoints: str | None = None,  # default: every sim, static
    start_sims: bool = True,
    port: int | None = None,  # the pods' shared port (default: a free one)
    picker_max_requests: int | None = None,  # Envoy's circuit breaker on the picker cluster (default 1024)
) -> AsyncIterator[Stack]:
    hosts = POD_HOSTS[:sims]
    port = port or shared_port(hosts)
    servers = [Sim(f"p{i}", host, port, (*sim_args, *(per_sim_args or {}).get(i, ()))) for i, host in enumerate(hosts)]
    with tempfile.TemporaryDirectory(prefix="picker-reliability-") as tmp_name:
        tmp = Path(tmp_name)
        access_log = tmp / "access.log"
        listen_port, admin_port = procs.free_port(), procs.free_port()
        picker_procs = [
            Picker(
                procs.free_port(),
                procs.free_port(),
                procs.free_port(),
                (
                    *(["--endpoints", endpoints or ",".join(s.key for s in servers)] if endpoints != "" else []),
                    *picker_args,
                    *EXTRA_PICKER_ARGS,
                ),
            )
            for _ in range(pickers)
        ]
        config = envoy_config.render(
            listen_port=listen_port,
            admin_port=admin_port,
            picker_port=picker_procs[0].grpc_port,
            extra_picker_ports=tuple(p.grpc_port for p in picker_procs[1:]),
            backends=[(s.host, s.port) for s in servers],
            body_mode=body_mode,
            failure_mode_allow=failure_mode_allow,
            access_log_path=str(access_log),
            picker_max_requests=picker_max_requests,
        )
        try:
            if start_sims:
                await asyncio.gather(*(s.start() for s in servers))
            await asyncio.gather(*(p.start() for p in picker_procs))
            async with envoy_config.run_envoy(config, admin_port):
                yield Stack(servers, picker_procs, f"http://127.0.0.1:{listen_port}", access_log, port, tmp)
                await asyncio.sleep(0.5)  # let Envoy flush the access log (every 200 ms)
        finally:
            for p in picker_procs:
                await p.stop()
            for s in servers:
                await s.stop()


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": server}}],
                "users": [{"name": "picker", "user": {"token": "picker-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "picker"}}],
                "current-context": "fake",
            }
        )
    )
    return path


class Load:
    """Open-loop load: a request every ``1/rate`` s whatever the answers, each with a client timeout."""

    def __init__(
        self,
        url: str,
        *,
        rate: float = 15.0,
        timeout_s: float = 8.0,
        max_tokens: int = 8,
        headers: Callable[[int], dict[str, str]] | None = None,
    ) -> None:
        self.url = url
        self.rate = rate
        self.headers = headers
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.results: list[Result] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    async def __aenter__(self) -> Load:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    async def _one(self, http: aiohttp.ClientSession, i: int) -> None:
        body = {"model": MODEL, "prompt": f"{PROMPT} #{i % 50}", "max_tokens": self.max_tokens, "ignore_eos": True}
        headers = self.headers(i) if self.headers is not None else {}
        sent, started = time.time(), time.monotonic()
        status, backend, retry_after = 0, "", None
        try:
            async with http.post(
                self.url + "/v1/completions",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
            ) as resp:
                await resp.read()
                status, backend = resp.status, resp.headers.get("x-backend", "")
                retry_after = resp.headers.get("retry-after")
        except (aiohttp.ClientError, TimeoutError, OSError):
            status = 0
        tag = ",".join(headers.values())
        self.results.append(Result(sent, time.monotonic() - started, status, backend, tag, retry_after))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        tasks: set[asyncio.Task[None]] = set()
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        async with aiohttp.ClientSession(connector=connector) as http:
            next_at = loop.time()
            i = 0
            while not self._stop.is_set():
                task = asyncio.create_task(self._one(http, i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                i += 1
                next_at += 1.0 / self.rate  # read each time: a scenario may change the rate mid-run
                delay = next_at - loop.time()
                if delay > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
            if tasks:
                await asyncio.wait(tasks)


@dataclass
class Row:
    case: str
    requests: int
    client_saw: str  # status counts, e.g. "200 x140, 503 x3"
    lost: int
    p50_ms: float
    p99_ms: float
    recovery_s: float | None  # None: not applicable
    recovery_what: str
    goal_met: bool
    notes: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    def markdown(self) -> str:
        recovery = "—" if self.recovery_s is None else f"{self.recovery_s:.2f} s"
        return (
            f"| {self.case} | {self.client_saw} | {self.p50_ms:.0f} / {self.p99_ms:.0f} ms | {recovery} "
            f"({self.recovery_what}) | {self.lost} of {self.requests} | {'yes' if self.goal_met else 'no'} |"
            f" {self.notes} |"
        )


def summarize(
    case: str,
    results: Sequence[Result],
    *,
    recovery_s: float | None,
    recovery_what: str,
    goal_met: bool,
    notes: str = "",
    extra: dict[str, float] | None = None,
) -> Row:
    counts = Counter(r.status for r in results)
    saw = ", ".join(f"{'no answer' if k == 0 else k}x{v}" for k, v in sorted(counts.items()))
    ok = sorted(r.latency_s for r in results if r.status == 200) or [0.0]
    p99 = ok[min(len(ok) - 1, int(len(ok) * 0.99))]
    lost = sum(1 for r in results if r.status != 200)
    return Row(
        case,
        len(results),
        saw,
        lost,
        statistics.median(ok) * 1000,
        p99 * 1000,
        recovery_s,
        recovery_what,
        goal_met,
        notes,
        extra or {},
    )


def last_to(accesses: Sequence[Access], upstream: str, after: float) -> float | None:
    """Start time of the last request Envoy sent to ``upstream`` at or after ``after`` (None: none)."""
    times = [a.start for a in accesses if a.upstream == upstream and a.start >= after]
    return max(times) if times else None


def first_to(accesses: Sequence[Access], upstream: str, after: float) -> float | None:
    times = [a.start for a in accesses if a.upstream == upstream and a.start >= after and a.code == 200]
    return min(times) if times else None


def recovered_after(
    results: Sequence[Result], calm_at: float, base_p50_s: float, *, step_s: float, steps: int
) -> float | None:
    """Seconds from ``calm_at`` until a 1-s window of sends (started every ``step_s``) has its successful
    requests' p50 within 1.5x ``base_p50_s``; None if none of ``steps`` windows does."""
    for start in (calm_at + step_s * k for k in range(steps)):
        window = [r.latency_s for r in results if start <= r.sent < start + 1.0 and r.status == 200]
        if window and statistics.median(window) <= 1.5 * base_p50_s:
            return start - calm_at
    return None
