"""picker itself overloaded: ten times the rate it serves, through the real Envoy, then calm again.

The floods of ``scenarios.overload`` overload the model servers; this one overloads picker. On this 2-core machine
the client and Envoy cannot send ten times what picker serves on a whole core, so picker runs as a scale model:
its process is held to a fraction of one core by a cgroup (v1 ``cpu`` controller, ``cpu.cfs_quota_us``; needs
root and a writable ``/sys/fs/cgroup/cpu``, so this is a documented run, not a CI test). The run:

1. capacity: a closed loop of 32 clients through Envoy for 4 s; what completes per second is what picker serves;
2. half of that for 4 s (the baseline latency), ten times it for 6 s (open loop, client timeout 5 s), half again
   for 10 s.

Measured: what the client saw in the flood, picker's scheduling time per request (its own histogram), picker's
peak RSS against the chart's 2 GiB limit, whether picker stayed up, and the recovery: from the flood's end until
a 1-s window's p50 is back within 1.5x the baseline p50.

    .venv/bin/python -m tests.reliability.picker_flood                       # native front and grpc.aio, FailClose
    .venv/bin/python -m tests.reliability.picker_flood --fail-open           # BUFFERED, FailOpen
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.reliability.harness import MODEL, PROMPT, Load, Picker, recovered_after, stack

CGROUP_ROOT = Path("/sys/fs/cgroup/cpu")
MEMORY_CAP_MB = 2048.0  # deploy/helm's memory limit
_PERIOD_US = 100_000


@contextlib.contextmanager
def cpu_share(pid: int, cores: float) -> Iterator[Path]:
    """Hold process ``pid`` (every thread) to ``cores`` of CPU time while the block runs."""
    group = CGROUP_ROOT / f"picker-flood-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text(str(_PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(int(_PERIOD_US * cores)))
        (group / "cgroup.procs").write_text(str(pid))
        yield group
    finally:
        with contextlib.suppress(OSError):  # picker may be gone already
            (CGROUP_ROOT / "cgroup.procs").write_text(str(pid))
        group.rmdir()


async def capacity(url: str, seconds: float = 4.0, clients: int = 32) -> float:
    """Requests per second completed by ``clients`` closed-loop clients."""
    done = 0
    stop_at = time.monotonic() + seconds
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 1}

    async def client(http: aiohttp.ClientSession) -> None:
        nonlocal done
        while time.monotonic() < stop_at:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with http.post(url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=10)) as r:
                    await r.read()
                    if r.status == 200 and time.monotonic() < stop_at:
                        done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return done / seconds


async def _scheduling(picker: Picker) -> tuple[float, float]:
    hist = "inference_extension_scheduler_e2e_duration_seconds"
    return await picker.metric(hist + "_sum"), await picker.metric(hist + "_count")


@dataclass
class Flooded:
    front: str
    mode: str
    capacity: float  # req/s served before the flood
    flood: float  # req/s offered in it
    saw: dict[int, int]  # status -> requests sent in the flood (0: no answer)
    p50_ms: float
    p99_ms: float
    base_p50_ms: float
    sched_ms: float  # picker's scheduling cycle, mean over the run
    rss_base_mb: float
    rss_max_mb: float
    alive: bool
    recovered_s: float | None
    envoy: dict[str, int]  # Envoy's access log in the flood: "status details" -> requests, for the non-200s

    def row(self) -> str:
        saw = ", ".join(f"{'no answer' if k == 0 else k} x {v}" for k, v in self.saw.items())
        recovered = "—" if self.recovered_s is None else f"{self.recovered_s:.2f} s"
        return (
            f"| {self.front} | {self.mode} | {self.capacity:.0f} → {self.flood:.0f} req/s | {saw} | "
            f"{self.p50_ms:.0f} / {self.p99_ms:.0f} ms (before: {self.base_p50_ms:.0f}) | {self.sched_ms:.2f} ms | "
            f"{self.rss_base_mb:.0f} → {self.rss_max_mb:.0f} MB (cap {MEMORY_CAP_MB:.0f}) | "
            f"{'yes' if self.alive else 'NO'} | {recovered} |"
        )


async def flood(front: str, *, fail_open: bool, cores: float, max_requests: int | None = None) -> Flooded:
    body_mode = "BUFFERED" if fail_open else "FULL_DUPLEX_STREAMED"
    args = ("--grpc-frontend", front)
    async with stack(
        sims=2, picker_args=args, body_mode=body_mode, failure_mode_allow=fail_open, picker_max_requests=max_requests
    ) as st:
        picker = st.pickers[0]
        assert picker.child is not None
        with cpu_share(picker.child.pid, cores):
            rate = await capacity(st.url)
            calm, high = rate / 2, rate * 10
            sched_before = await _scheduling(picker)
            async with Load(st.url, rate=calm, timeout_s=5, max_tokens=1) as load:
                await asyncio.sleep(4.0)
                rss_base = rss_max = picker.rss_bytes()
                flood_at = time.time()
                load.rate = high
                while time.time() - flood_at < 6.0:
                    await asyncio.sleep(0.25)
                    rss_max = max(rss_max, picker.rss_bytes())
                load.rate = calm
                calm_at = time.time()
                await asyncio.sleep(10.0)
            alive = picker.child.returncode is None
            sched_after = await _scheduling(picker)
        await asyncio.sleep(0.5)
        flags = Counter(
            f"{a.code} {a.details}" for a in st.accesses() if flood_at <= a.start < calm_at and a.code != 200
        )
    results = load.results
    baseline = [r.latency_s for r in results if r.sent < flood_at and r.status == 200]
    base_p50 = statistics.median(baseline) if baseline else 0.0
    during = [r for r in results if flood_at <= r.sent < calm_at]
    ok_during = sorted(r.latency_s for r in during if r.status == 200)
    recovered_s = recovered_after(results, calm_at, base_p50, step_s=0.25, steps=36)
    count = sched_after[1] - sched_before[1]
    return Flooded(
        front=front,
        mode=f"{body_mode}, {'FailOpen' if fail_open else 'FailClose'}, max_requests {max_requests or 1024}",
        capacity=rate,
        flood=high,
        saw=dict(sorted(Counter(r.status for r in during).items())),
        p50_ms=(ok_during[len(ok_during) // 2] * 1000) if ok_during else float("nan"),
        p99_ms=(ok_during[min(len(ok_during) - 1, int(len(ok_during) * 0.99))] * 1000) if ok_during else 0.0,
        base_p50_ms=base_p50 * 1000,
        sched_ms=(sched_after[0] - sched_before[0]) / count * 1000 if count else float("nan"),
        rss_base_mb=rss_base / 2**20,
        rss_max_mb=rss_max / 2**20,
        alive=alive,
        recovered_s=recovered_s,
        envoy=dict(flags.most_common()),
    )


async def main(fronts: list[str], fail_open: bool, cores: float, max_requests: int | None) -> None:
    print(
        "| front | gateway | served → offered | flood: sent, client saw | latency p50 / p99 (ok) | scheduling "
        "(mean) | picker RSS | up | recovery |\n|---|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    for front in fronts:
        result = await flood(front, fail_open=fail_open, cores=cores, max_requests=max_requests)
        print(result.row(), flush=True)
        print(f"    Envoy's non-200s (status, response code details): {result.envoy}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--front", action="append", choices=("native", "grpc"), help="default: both")
    parser.add_argument(
        "--fail-open", action="store_true", help="BUFFERED with FailOpen (default FULL_DUPLEX, FailClose)"
    )
    parser.add_argument("--cores", type=float, default=0.1, help="picker's CPU share (default 0.1 of a core)")
    parser.add_argument("--max-requests", type=int, help="Envoy's circuit breaker on the picker cluster (default 1024)")
    ns = parser.parse_args()
    asyncio.run(main(ns.front or ["native", "grpc"], ns.fail_open, ns.cores, ns.max_requests))
