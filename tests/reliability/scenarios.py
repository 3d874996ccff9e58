"""The fault scenarios of docs/reliability.md: each builds a stack (harness.py), runs load, injects one fault, and
returns a ``Row``. ``long=False`` is the CI size (seconds of load around the fault); ``long=True`` the documented
one (the cold start takes ~48 s as a real model load, the API server stays down for a minute, ...).

The faulty server ("victim") is the one that served the most requests before the fault, so the measurement never
depends on which server the scheduler happened to prefer.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from picker.bench.policies import REFERENCE_CONFIG_TEXT
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import objective, pod, pool
from tests.reliability.harness import (
    POD_HOSTS,
    Load,
    Row,
    Sim,
    Stack,
    last_to,
    recovered_after,
    shared_port,
    stack,
    summarize,
    write_kubeconfig,
)

SCRAPE_INTERVAL_S = 0.1  # picker's default --refresh-metrics-interval
STALENESS_S = 2.0  # picker's default --metrics-staleness-threshold
WARM_S = 2.0
LEFT_POOL_GOAL_S = 5.0  # nothing routed to an endpoint that left the pool after this

Scenario = Callable[[bool], Awaitable[Row]]


def busiest(st: Stack, since: float) -> Sim:
    counts = Counter(a.upstream for a in st.accesses() if a.start >= since and a.code == 200)
    by_key = {s.key: s for s in st.sims}
    for key, _ in counts.most_common():
        if key in by_key:
            return by_key[key]
    return st.sims[0]


def recovery_after(st: Stack, victim: Sim, t0: float) -> float:
    last = last_to(st.accesses(), victim.key, t0)
    return 0.0 if last is None else max(0.0, last - t0)


async def _warm(st: Stack) -> tuple[float, Sim]:
    began = time.time()
    await asyncio.sleep(WARM_S + 0.3)  # +0.3: the access log is flushed every 200 ms
    return began, busiest(st, began)


async def server_killed(long: bool) -> Row:
    async with stack() as st:
        async with Load(st.url, timeout_s=5) as load:
            _, victim = await _warm(st)
            t0 = time.time()
            victim.signal(signal.SIGKILL)
            await asyncio.sleep(15 if long else 4)
        await asyncio.sleep(0.4)
        recovery = recovery_after(st, victim, t0)
    goal = 2 * SCRAPE_INTERVAL_S
    return summarize(
        "model server killed (SIGKILL)",
        load.results,
        recovery_s=recovery,
        recovery_what="last request sent to it after the kill",
        goal_met=recovery <= goal,
        notes=f"goal ≤ {goal:g} s (2 scrape intervals)",
    )


HUNG_GOAL_S = 1.0  # hung-server detection: no request to it after this (picker/endpoints/hung.py)


async def server_hung(long: bool, *, config_text: str | None = None, what: str = "") -> Row:
    picker_args = ("--config-text", config_text) if config_text else ()
    async with stack(picker_args=picker_args) as st:
        async with Load(st.url, timeout_s=5) as load:
            _, victim = await _warm(st)
            t0 = time.time()
            victim.signal(signal.SIGSTOP)  # the kernel still accepts connections; nothing answers
            await asyncio.sleep(15 if long else 5)
        await asyncio.sleep(0.4)
        recovery = recovery_after(st, victim, t0)
    # Sent before the stop: routed while the server still answered, lost whatever picker does.
    unsavable = sum(1 for r in load.results if r.status != 200 and r.sent < t0)
    return summarize(
        f"model server hung (SIGSTOP: accepts, never answers){what}",
        load.results,
        recovery_s=recovery,
        recovery_what="last request sent to it",
        goal_met=recovery <= HUNG_GOAL_S,
        notes=f"{unsavable} of the lost sent before it stopped; goal ≤ {HUNG_GOAL_S:g} s",
        extra={"lost_sent_before_stop": unsavable},
    )


async def server_hung_reference(long: bool) -> Row:
    """The same with the reference's scorers only: detection does not depend on the scheduling plugins."""
    return await server_hung(long, config_text=REFERENCE_CONFIG_TEXT, what=", reference scorers")


async def server_slow(long: bool) -> Row:
    window = 10.0 if long else 4.0
    async with stack() as st:
        async with Load(st.url, timeout_s=10) as load:
            began, victim = await _warm(st)
            t0 = time.time()
            await victim.faults(spike_rate=1.0, spike_s=0.15)  # every engine step stalls 150 ms: ~15x slower
            await asyncio.sleep(window)
        await asyncio.sleep(0.4)
        acc = [a for a in st.accesses() if a.code == 200]
    before = [a for a in acc if began <= a.start < t0]
    after = [a for a in acc if a.start >= t0 + window / 2]
    share_before = sum(a.upstream == victim.key for a in before) / max(1, len(before))
    share_after = sum(a.upstream == victim.key for a in after) / max(1, len(after))
    return summarize(
        "model server slow (every step +150 ms)",
        load.results,
        recovery_s=None,
        recovery_what=f"share of requests on it: {share_before:.0%} before, {share_after:.0%} in the 2nd half",
        goal_met=share_after < share_before,
        notes="goal: traffic moves away from it",
        extra={"share_before": share_before, "share_after": share_after},
    )


async def server_5xx(long: bool) -> Row:
    fault_s = 15.0 if long else 5.0
    async with stack() as st:
        async with Load(st.url, timeout_s=5) as load:
            _, victim = await _warm(st)
            t0 = time.time()
            await victim.faults(error_rate=1.0, error_types=["server_error"])
            await asyncio.sleep(fault_s)
        await asyncio.sleep(0.4)
        to_victim = sorted(a.start for a in st.accesses() if a.upstream == victim.key and a.start >= t0)
    # The first ejection ends the first run of requests to it; after the ejection (10 s, then 20 s, ...) picker
    # readmits it and 5 more failures eject it again, as Envoy's outlier detection re-probes.
    ejected_at = next((a for a, b in itertools.pairwise(to_victim) if b - a > 1.0), None)
    if ejected_at is None and to_victim:
        ejected_at = to_victim[-1]
    recovery = 0.0 if ejected_at is None else max(0.0, ejected_at - t0)
    fifth = to_victim[4] - t0 if len(to_victim) >= 5 else recovery  # when the 5th failing request was sent
    lost = sum(1 for r in load.results if r.status != 200)
    probes = 1 + int(fault_s > 10.0)  # ejections the fault lasts long enough for
    return summarize(
        "model server answers 500 to everything",
        load.results,
        recovery_s=recovery,
        recovery_what="until it was ejected (5 consecutive 5xx)",
        # Ejected at its 5th failure, however long the 5 took to come (few go there when others take the load)
        goal_met=recovery <= max(2 * SCRAPE_INTERVAL_S + 1.0, fifth + 2 * SCRAPE_INTERVAL_S) and lost <= 7 * probes,
        notes=f"its /metrics still answers; re-probed after each ejection (10 s, then 20 s); ≤ {7 * probes} lost",
    )


async def _metrics_fault(case: str, long: bool, notes: str, **faults: object) -> Row:
    async with stack() as st:
        picker = st.pickers[0]
        async with Load(st.url, timeout_s=5) as load:
            _, victim = await _warm(st)
            rss_before = picker.rss_bytes()
            t0 = time.time()
            await victim.faults(**faults)
            await asyncio.sleep(10 if long else 4)
            rss_after = picker.rss_bytes()
        await asyncio.sleep(0.4)
        recovery = recovery_after(st, victim, t0)
    rss_growth_mb = (rss_after - rss_before) / 2**20
    lost = sum(1 for r in load.results if r.status != 200)
    return summarize(
        case,
        load.results,
        recovery_s=recovery,
        recovery_what="last request sent to it (it still serves: excluded for stale metrics)",
        goal_met=lost == 0 and rss_growth_mb < 30,
        notes=f"{notes}; picker RSS {rss_growth_mb:+.1f} MB",
        extra={"rss_growth_mb": rss_growth_mb},
    )


async def metrics_slow(long: bool) -> Row:
    return await _metrics_fault("/metrics slow (3 s per page)", long, "scrape timeout 1 s", metrics_delay_s=3.0)


async def metrics_garbage(long: bool) -> Row:
    return await _metrics_fault("/metrics garbage", long, "not Prometheus text", metrics_mode="garbage")


async def metrics_huge(long: bool) -> Row:
    return await _metrics_fault("/metrics 50 MB", long, "read cap 4 MiB", metrics_mode="huge")


async def cold_start(long: bool) -> Row:
    startup_s = 48.0 if long else 4.0
    async with stack(per_sim_args={2: ("--startup-s", str(startup_s))}, start_sims=False) as st:
        cold, picker = st.sims[2], st.pickers[0]
        await asyncio.gather(*(s.start() for s in st.sims[:2]), cold.start(wait=False))
        # A pod cold-starting in a running pool: the others are up and schedulable before the load starts.
        for _ in range(100):
            if all([await picker.metric("picker_endpoint_excluded", s.key) == 0.0 for s in st.sims[:2]]):
                break
            await asyncio.sleep(0.05)
        async with Load(st.url, timeout_s=5) as load:
            assert cold.child is not None
            await asyncio.sleep(1.0)
            excluded_while_cold = await picker.metric("picker_endpoint_excluded", cold.key)
            await cold.child.wait_http(cold.url + "/health", startup_s + 30)
            ready_at = time.monotonic()
            readmitted_s = None
            while time.monotonic() - ready_at < 5.0:
                if await picker.metric("picker_endpoint_excluded", cold.key) == 0.0:
                    readmitted_s = time.monotonic() - ready_at
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
        await asyncio.sleep(0.4)
        acc = st.accesses()
    sent_cold = [a for a in acc if a.upstream == cold.key and a.code != 200]
    lost = sum(1 for r in load.results if r.status != 200)
    return summarize(
        f"cold-starting endpoint (port opens after {startup_s:g} s)",
        load.results,
        recovery_s=readmitted_s,
        recovery_what="from its port opening to being schedulable again",
        goal_met=lost == 0 and excluded_while_cold == 1.0 and readmitted_s is not None and readmitted_s <= 1.0,
        notes=f"excluded while cold: {'yes' if excluded_while_cold else 'no'}; {len(sent_cold)} requests failed on it",
    )


async def _picker_restart(case: str, long: bool, *, body_mode: str, fail_open: bool) -> Row:
    down_s = 5.0 if long else 2.0
    async with stack(body_mode=body_mode, failure_mode_allow=fail_open) as st:
        picker = st.pickers[0]
        async with Load(st.url, timeout_s=5) as load:
            await asyncio.sleep(WARM_S)
            t0 = time.time()
            picker.kill()
            await asyncio.sleep(down_s)
            await picker.stop()
            await picker.start()
            back = time.time()
            await asyncio.sleep(3.0)
        await asyncio.sleep(0.4)
        acc = st.accesses()
    routed = [a.start for a in acc if a.start >= back - 1.0 and a.cluster == "original_destination" and a.code == 200]
    picked_again = None if not routed else max(0.0, min(routed) - back)
    fallback = sum(1 for a in acc if t0 <= a.start and a.cluster == "pool_round_robin" and a.code == 200)
    lost = sum(1 for r in load.results if r.status != 200)
    return summarize(
        case,
        load.results,
        recovery_s=picked_again,
        recovery_what="from restart to the first request routed by picker",
        goal_met=(lost == 0) if fail_open else picked_again is not None and picked_again < 2.0,
        notes=f"down {down_s:g} s; {fallback} requests served by the fallback route (round robin, no picker)",
    )


async def picker_killed_fail_open(long: bool) -> Row:
    return await _picker_restart(
        "picker killed and restarted, FailOpen (BUFFERED)", long, body_mode="BUFFERED", fail_open=True
    )


async def picker_killed_fail_close(long: bool) -> Row:
    return await _picker_restart(
        "picker killed and restarted, FailClose (FULL_DUPLEX)", long, body_mode="FULL_DUPLEX_STREAMED", fail_open=False
    )


async def picker_replica_killed(long: bool) -> Row:
    async with stack(pickers=2) as st:
        async with Load(st.url, timeout_s=5) as load:
            await asyncio.sleep(WARM_S)
            t0 = time.time()
            st.pickers[0].kill()
            await asyncio.sleep(8 if long else 4)
        await asyncio.sleep(0.4)
    failed = [r.sent for r in load.results if r.status != 200 and r.sent >= t0]
    recovery = 0.0 if not failed else max(failed) - t0
    return summarize(
        "one of two picker replicas killed (FailClose)",
        load.results,
        recovery_s=recovery,
        recovery_what="until the last failed request",
        goal_met=recovery <= 1.0,
        notes="Envoy ejects the dead replica at its first refused connection",
    )


# -- Kubernetes --------------------------------------------------------------------------------------------


async def _kube(case: str, long: bool, fault: Callable[[FakeApiServer, Stack, Sim, bool], Awaitable[float]]) -> Row:
    """Pool mode against the stand-in API server. ``fault`` disturbs the API and deletes the victim's pod; it
    returns the time from which picker could know of the deletion. Recovery: from then to the last request that
    still went to the deleted pod."""
    port = shared_port(POD_HOSTS[:3])
    async with FakeApiServer() as api:
        api.create("inferencepools", pool(ports=(port,)))
        for i, host in enumerate(POD_HOSTS[:3]):
            api.create("pods", pod(f"p{i}", host))
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api.url)
            args = ("--pool-name", "pool", "--kubeconfig", str(kubeconfig))
            async with stack(endpoints="", picker_args=args, port=port) as st:
                async with Load(st.url, timeout_s=5) as load:
                    _, victim = await _warm(st)
                    seen_from = await fault(api, st, victim, long)
                    await asyncio.sleep(LEFT_POOL_GOAL_S + 1.0)
                await asyncio.sleep(0.4)
                last = last_to(st.accesses(), victim.key, seen_from)
    recovery = 0.0 if last is None else max(0.0, last - seen_from)
    lost = sum(1 for r in load.results if r.status != 200)
    return summarize(
        case,
        load.results,
        recovery_s=recovery,
        recovery_what="pod deleted (API reachable) → its last request",
        goal_met=recovery <= LEFT_POOL_GOAL_S and lost == 0,
        notes=f"goal: nothing routed to it {LEFT_POOL_GOAL_S:g} s after it left, nothing lost",
    )


def _delete(api: FakeApiServer, st: Stack, victim: Sim) -> float:
    api.delete("pods", f"p{st.sims.index(victim)}")
    return time.time()


async def _watch_cut(api: FakeApiServer, st: Stack, victim: Sim, long: bool) -> float:
    api.cut_watches()
    await asyncio.sleep(0.2)
    return _delete(api, st, victim)


async def _gone(api: FakeApiServer, st: Stack, victim: Sim, long: bool) -> float:
    deleted = _delete(api, st, victim)
    api.compact()  # the deletion is older than the watch cache now: only a relist can tell
    api.expire_watches()
    return deleted


async def _api_down(api: FakeApiServer, st: Stack, victim: Sim, long: bool) -> float:
    await api.go_down()
    await asyncio.sleep(1.0)
    _delete(api, st, victim)  # while nobody can watch
    await asyncio.sleep((60.0 if long else 5.0) - 1.0)
    await api.come_back()
    return time.time()


async def watch_cut(long: bool) -> Row:
    return await _kube("Kubernetes watch cut, then a pod deleted", long, _watch_cut)


async def watch_gone(long: bool) -> Row:
    return await _kube("Kubernetes 410 Gone (watch expired, history compacted)", long, _gone)


async def api_down(long: bool) -> Row:
    return await _kube(f"API server down {60 if long else 5} s, a pod deleted meanwhile", long, _api_down)


SCENARIOS: dict[str, Scenario] = {
    "server_killed": server_killed,
    "server_hung": server_hung,
    "server_hung_reference": server_hung_reference,
    "server_slow": server_slow,
    "server_5xx": server_5xx,
    "metrics_slow": metrics_slow,
    "metrics_garbage": metrics_garbage,
    "metrics_huge": metrics_huge,
    "cold_start": cold_start,
    "watch_cut": watch_cut,
    "watch_gone": watch_gone,
    "api_down": api_down,
    "picker_killed_fail_open": picker_killed_fail_open,
    "picker_killed_fail_close": picker_killed_fail_close,
    "picker_replica_killed": picker_replica_killed,
}


# -- overload ------------------------------------------------------------------------------------------------

OVERLOAD_CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: max-score-picker
- type: concurrency-detector
  parameters: {maxConcurrency: 4}
saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: max-score-picker}]
flowControl:
  maxRequests: 40
  defaultRequestTTL: 3s
"""


async def overload(long: bool) -> Row:
    """Two pods of 4 slots each (~0.75 s a request: ~10 req/s capacity); 0.5x capacity, then a burst at 5x, then
    0.5x again. Flow control (concurrency detector, queue of 40, 3 s TTL), objectives `interactive` (priority 10)
    and `batch` (0), half the requests each; picker answers 429/503 with `Retry-After: 2`."""
    capacity = 10.0
    burst_s = 20.0 if long else 6.0
    port = shared_port(POD_HOSTS[:2])
    async with FakeApiServer() as api:
        api.create("inferencepools", pool(ports=(port,)))
        for i, host in enumerate(POD_HOSTS[:2]):
            api.create("pods", pod(f"p{i}", host))
        api.create("inferenceobjectives", objective("interactive", 10))
        api.create("inferenceobjectives", objective("batch", 0))
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", api.url)
            args = (
                "--pool-name", "pool", "--kubeconfig", str(kubeconfig), "--config-text", OVERLOAD_CONFIG,
                "--retry-after", "2",
            )  # fmt: skip
            sim_args = ("--preset", "h100-8b", "--max-num-seqs", "4")
            async with stack(sims=2, sim_args=sim_args, endpoints="", picker_args=args, port=port) as st:
                picker = st.pickers[0]

                def objective_of(i: int) -> dict[str, str]:
                    return {"x-gateway-inference-objective": "interactive" if i % 2 else "batch"}

                async with Load(st.url, rate=capacity / 2, timeout_s=15, max_tokens=64, headers=objective_of) as load:
                    await asyncio.sleep(4.0)
                    rss_base = picker.rss_bytes()
                    burst_at = time.time()
                    load.rate = capacity * 5
                    queue_max, rss_max = 0.0, rss_base
                    while time.time() - burst_at < burst_s:
                        await asyncio.sleep(0.25)
                        queue_max = max(queue_max, await picker.metric("inference_extension_flow_control_queue_size"))
                        rss_max = max(rss_max, picker.rss_bytes())
                    load.rate = capacity / 2
                    calm_at = time.time()
                    await asyncio.sleep(8.0)
    results = load.results
    baseline = [r.latency_s for r in results if r.sent < burst_at and r.status == 200]
    base_p50 = statistics.median(baseline) if baseline else 0.0
    during = [r for r in results if burst_at <= r.sent < calm_at]
    rejected = [r for r in during if r.status in (429, 503)]
    with_retry_after = sum(1 for r in rejected if r.retry_after == "2")
    tags = ("interactive", "batch")
    served = {tag: sum(1 for r in during if r.tag.endswith(tag) and r.status == 200) for tag in tags}
    sent = {tag: sum(1 for r in during if r.tag.endswith(tag)) for tag in tags}
    recovered_s = recovered_after(results, calm_at, base_p50, step_s=0.5, steps=14)
    share = {t: served[t] / max(1, sent[t]) for t in served}
    rss_growth_mb = (rss_max - rss_base) / 2**20
    lost = sum(1 for r in results if r.status != 200)
    goal = (
        queue_max <= 40
        and rss_growth_mb < 50
        and share["interactive"] > share["batch"]
        and len(rejected) > 0
        and with_retry_after == len(rejected)
        and recovered_s is not None
        and recovered_s <= 3.0 + 3.0  # the queue's TTL (what may still wait at the burst's end) + 3 s
        and all(r.status in (200, 429, 503) for r in results)
    )
    row = summarize(
        f"overload: 5x capacity for {burst_s:g} s, flow control on",
        results,
        recovery_s=recovered_s,
        recovery_what="burst end → p50 back within 1.5x of before",
        goal_met=goal,
        notes=(
            f"queue max {queue_max:.0f} (cap 40); picker RSS {rss_growth_mb:+.1f} MB; served in the burst: "
            f"interactive {share['interactive']:.0%}, batch {share['batch']:.0%}; "
            f"{with_retry_after}/{len(rejected)} rejections with Retry-After"
        ),
        extra={"queue_max": queue_max, "interactive": share["interactive"], "batch": share["batch"]},
    )
    row.lost = lost
    return row


SCENARIOS["overload"] = overload
