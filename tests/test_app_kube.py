"""``serving(kube=...)`` end to end: discovery from the stand-in API server through the ext_proc path.

The model servers are real HTTP backends (tests/e2e/backends.py) that play the pool's pods: each is bound to its own
loopback address (127.0.0.2, 127.0.0.3, ...) on one shared port, the pool's target port, so a pod's IP and the
pool's port reach it exactly as in a cluster, and picker scrapes its /metrics. Requests are driven like Envoy in
FULL_DUPLEX_STREAMED (tests/extproc/gateway.py), which gives back the destination and the body sent upstream.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker.app import Running, serving
from picker.bench import procs
from picker.discovery.kubesettings import KubeSettings
from picker.discovery.leaderelection import LeaderRecord, lease_name
from picker.endpoints.policy import PolicyStore
from picker.settings import ScrapeSettings
from tests.e2e.backends import Backend
from tests.extproc.conftest import sample, settings
from tests.extproc.gateway import Gateway
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import eventually, objective, pod, pool, rewrite

pytestmark = pytest.mark.timeout(60)

KUBE = KubeSettings(
    pool_name="pool",
    resync_s=30,
    watch_timeout_s=5,
    request_timeout_s=5,
    backoff_initial_s=0.02,
    backoff_max_s=0.1,
    crd_recheck_s=0.2,
)
PODS = {"p1": "127.0.0.2", "p2": "127.0.0.3", "p3": "127.0.0.4"}
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def shared_port(hosts: Iterator[str]) -> int:
    """A port free on every one of ``hosts`` (each pod of a pool listens on the pool's target port)."""
    for _ in range(20):
        with socket.socket() as probe:
            probe.bind((next(iter(PODS.values())), 0))
            port = int(probe.getsockname()[1])
        try:
            for host in list(hosts):
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every pod address")


@dataclass
class Stack:
    api: FakeApiServer
    backends: dict[str, Backend]
    running: Running
    policies: PolicyStore
    port: int

    def key(self, pod_name: str) -> str:
        return f"{PODS[pod_name]}:{self.port}"

    def endpoint_keys(self) -> set[str]:
        return {e.key for e in self.running.store.current()}

    def scraped(self, *pod_names: str) -> bool:
        eps = {e.key: e for e in self.running.store.current()}
        return all(self.key(n) in eps and eps[self.key(n)].metrics.updated_at > 0 for n in pod_names)


def set_ready(api: FakeApiServer, name: str, ready: bool) -> None:
    def mutate(obj: dict[str, object]) -> None:
        status = obj["status"]
        assert isinstance(status, dict)
        status["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]

    api.patch("pods", name, mutate)


@contextlib.asynccontextmanager
async def pool_stack(queues: dict[str, int], ready: dict[str, bool]) -> AsyncIterator[Stack]:
    port = shared_port(iter(PODS.values()))
    backends = {name: Backend(name, queue=queues[name], host=ip, port=port) for name, ip in PODS.items()}
    async with contextlib.AsyncExitStack() as stack:
        for backend in backends.values():
            await backend.start()
            stack.push_async_callback(backend.stop)
        api = await stack.enter_async_context(FakeApiServer())
        api.create("inferencepools", pool(ports=(port,)))
        for name, ip in PODS.items():
            api.create("pods", pod(name, ip, ready=ready[name]))
        scrape = dataclasses.replace(ScrapeSettings(), interval_s=0.05)
        policies = PolicyStore()
        running = await stack.enter_async_context(
            serving(
                dataclasses.replace(settings(), scrape=scrape),
                kube=dataclasses.replace(KUBE, api_server=api.url),
                policies=policies,
            )
        )
        yield Stack(api, backends, running, policies, port)


async def route(gateway: Gateway, model: str, prompt: str, headers: dict[str, str] | None = None) -> tuple[str, str]:
    """One completion through ext_proc: (destination, model in the body sent upstream)."""
    body = orjson.dumps({"model": model, "prompt": prompt, "max_tokens": 1})
    outcome = await gateway.request(
        {":method": "POST", ":path": "/v1/completions", "content-type": "application/json", **(headers or {})},
        [body],
    )
    assert outcome.routed, (outcome.status, outcome.error_body)
    assert outcome.destination is not None
    assert outcome.upstream_body is not None
    return outcome.destination, str(orjson.loads(outcome.upstream_body)["model"])


async def test_routes_to_ready_pods_only_and_follows_readiness_at_once() -> None:
    # p3 reports the emptiest queue: were it ever a candidate while unready, it would be picked.
    async with pool_stack({"p1": 3, "p2": 3, "p3": 0}, {"p1": True, "p2": True, "p3": False}) as s:
        await eventually(lambda: s.running.health.ready and s.scraped("p1", "p2"), what="synced and scraped")
        gateway = Gateway(s.running.grpc_target)
        try:
            first = [(await route(gateway, "m", f"a{i}"))[0] for i in range(20)]
            assert set(first) <= {s.key("p1"), s.key("p2")}

            set_ready(s.api, "p3", True)  # the pod turns ready: it joins at once and, once scraped, is favoured
            await eventually(lambda: s.scraped("p3"), what="p3 joined and scraped")
            joined = [(await route(gateway, "m", f"b{i}"))[0] for i in range(10)]
            assert s.key("p3") in joined

            set_ready(s.api, "p3", False)  # unready: no pick may reach it from the moment discovery sees it
            await eventually(lambda: s.key("p3") not in s.endpoint_keys(), what="p3 left")
            after = [(await route(gateway, "m", f"c{i}"))[0] for i in range(20)]
            assert s.key("p3") not in after
            assert s.api.count("list", "pods") == 1  # watch events did it, not relists
        finally:
            await gateway.close()


async def test_objective_priority_and_weighted_rewrite_apply_to_requests() -> None:
    async with pool_stack({"p1": 0, "p2": 0, "p3": 0}, {"p1": True, "p2": True, "p3": False}) as s:
        s.api.create("inferenceobjectives", objective("premium", 5))
        s.api.create("inferenceobjectives", objective("batch", -1))
        s.api.create("inferencemodelrewrites", rewrite("canary", [(["llama"], [("llama-v1", 80), ("llama-v2", 20)])]))
        await eventually(lambda: s.running.health.ready and s.scraped("p1", "p2"), what="synced and scraped")
        await eventually(
            lambda: len(s.policies.current().objectives) == 2 and len(s.policies.current().rewrites) == 1,
            what="objectives and rewrite published",
        )

        def counted(model: str, target: str, priority: int) -> float:
            labels = {"model_name": model, "target_model_name": target, "priority": str(priority)}
            return sample("inference_objective_request_total", labels)

        def rewrites(target: str) -> float:
            labels = {"model_rewrite_name": "canary", "model_name": "llama", "target_model": target}
            return sample("inference_extension_model_rewrite_decisions_total", labels)

        gateway = Gateway(s.running.grpc_target)
        try:
            before = {t: counted("llama", t, 5) for t in ("llama-v1", "llama-v2")}
            rewrites_before = {t: rewrites(t) for t in ("llama-v1", "llama-v2")}
            models: collections.Counter[str] = collections.Counter()
            n = 200
            for i in range(n):
                _, upstream_model = await route(gateway, "llama", f"q{i}", {"x-gateway-inference-objective": "premium"})
                models[upstream_model] += 1
            assert set(models) == {"llama-v1", "llama-v2"}
            # Weights 80/20: llama-v2 ~ Binomial(200, 0.2), mean 40, sd 5.7; these bounds are ±4.4 sd.
            assert 15 <= models["llama-v2"] <= 65, models
            # The objective's priority (5) and the target model are on the reference metric, per request.
            after = {t: counted("llama", t, 5) for t in ("llama-v1", "llama-v2")}
            assert {t: after[t] - before[t] for t in after} == {t: float(c) for t, c in models.items()}
            # Each rewrite decision is counted on the reference metric, by rule and target.
            decided = {t: rewrites(t) - rewrites_before[t] for t in rewrites_before}
            assert decided == {t: float(c) for t, c in models.items()}

            # A model no rule names passes unchanged; no objective header is priority 0; a negative one too shows.
            plain_before = counted("other", "other", 0)
            assert (await route(gateway, "other", "x"))[1] == "other"
            assert counted("other", "other", 0) == plain_before + 1
            batch_before = counted("other", "other", -1)
            await route(gateway, "other", "y", {"x-gateway-inference-objective": "batch"})
            assert counted("other", "other", -1) == batch_before + 1
        finally:
            await gateway.close()


async def health(running: Running, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{running.health_port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(reply.status)


async def test_leader_election_gates_readiness_and_hands_over_on_shutdown() -> None:
    port = shared_port(iter(PODS.values()))
    async with contextlib.AsyncExitStack() as stack:
        backend = Backend("p1", host=PODS["p1"], port=port)
        await backend.start()
        stack.push_async_callback(backend.stop)
        api = await stack.enter_async_context(FakeApiServer())
        api.create("inferencepools", pool(ports=(port,)))
        api.create("pods", pod("p1", PODS["p1"]))
        kube = dataclasses.replace(
            KUBE,
            api_server=api.url,
            leader_election=True,
            lease_duration_s=3.0,
            renew_deadline_s=2.0,
            retry_period_s=0.1,
        )

        def replica(identity: str) -> contextlib.AbstractAsyncContextManager[Running]:
            return serving(settings(), kube=dataclasses.replace(kube, identity=identity), policies=PolicyStore())

        lease = lease_name("default", "pool")
        async with replica("epp-0") as first:
            await eventually(lambda: first.health.ready, what="the first replica leads")
            async with replica("epp-1") as second:
                await eventually(lambda: second.store.current().synced, what="the standby synced")
                # Warm standby: endpoints discovered, not ready; alive.
                assert [e.key for e in second.store.current()] == [f"{PODS['p1']}:{port}"]
                for service in ("", "readiness", "inference-extension", "envoy.service.ext_proc.v3.ExternalProcessor"):
                    assert await health(second, service) == NOT_SERVING
                    assert await health(first, service) == SERVING
                assert await health(second, "liveness") == SERVING
                # A stream that reaches the standby anyway is still served (nothing there depends on leadership).
                gateway = Gateway(second.grpc_target)
                try:
                    assert (await route(gateway, "m", "x"))[0] == f"{PODS['p1']}:{port}"
                finally:
                    await gateway.close()

                assert LeaderRecord.of(api.get("leases", lease)).holder == "epp-0"
                await first.begin_shutdown()  # SIGTERM's first step: health NOT_SERVING, the Lease released
                assert await health(first, "readiness") == NOT_SERVING
                await eventually(lambda: second.health.ready, what="the standby takes over")
                assert await health(second, "readiness") == SERVING
                assert LeaderRecord.of(api.get("leases", lease)).holder == "epp-1"
            # The second replica released the Lease on its way out too.
            assert LeaderRecord.of(api.get("leases", lease)).holder == ""


async def test_picker_serve_processes_elect_a_leader_and_hand_over_on_sigterm(tmp_path: Path) -> None:
    """``picker serve --pool-name --ha-enable-leader-election`` as real processes, reaching the stand-in API
    server through a kubeconfig: SIGTERM to the leader releases the Lease at once and the standby turns ready."""
    async with FakeApiServer() as api:
        api.create("inferencepools", pool(ports=(8000,)))
        api.create("pods", pod("p1", PODS["p1"]))
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "stand-in", "cluster": {"server": api.url}}],
                    "users": [{"name": "anonymous", "user": {}}],
                    "contexts": [{"name": "test", "context": {"cluster": "stand-in", "user": "anonymous"}}],
                    "current-context": "test",
                }
            )
        )
        lease = lease_name("default", "pool")

        def holder() -> str:
            with contextlib.suppress(KeyError):
                return LeaderRecord.of(api.get("leases", lease)).holder
            return ""

        async with replica_process("epp-a", kubeconfig) as a:
            await eventually(lambda: holder() == "epp-a", timeout_s=20, what="epp-a leads")
            await wait_status(a.health_port, "readiness", SERVING)
            async with replica_process("epp-b", kubeconfig) as b:
                await wait_status(b.health_port, "liveness", SERVING)
                await eventually(lambda: api.count("get", "leases") >= 2, what="epp-b campaigning")
                assert await health_at(b.health_port, "readiness") == NOT_SERVING
                a.proc.send_signal(signal.SIGTERM)
                await wait_status(b.health_port, "readiness", SERVING)
                assert holder() == "epp-b"
                assert await asyncio.wait_for(a.proc.wait(), 20) == 0
            assert await asyncio.wait_for(b.proc.wait(), 20) == 0
        assert holder() == ""  # released by the last one out
        messages = sorted(e["message"] for e in api._objects[api.resource("events")].values())
        assert messages == [
            "epp-a became leader",
            "epp-a stopped leading",
            "epp-b became leader",
            "epp-b stopped leading",
        ]


@dataclass
class Process:
    proc: asyncio.subprocess.Process
    health_port: int


@contextlib.asynccontextmanager
async def replica_process(pod_name: str, kubeconfig: Path) -> AsyncIterator[Process]:
    health_port = free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "picker.cli", "serve",
        "--pool-name", "pool", "--pool-namespace", "default", "--kubeconfig", str(kubeconfig),
        "--ha-enable-leader-election",
        "--host", "127.0.0.1", "--grpc-port", str(free_port()), "--grpc-health-port", str(health_port),
        "--metrics-port", "0", "--secure-serving=false", "--grace-period", "0.5s",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, POD_NAME=pod_name, KUBERNETES_SERVICE_HOST=""),
    )  # fmt: skip
    try:
        yield Process(proc, health_port)
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def free_port() -> int:
    return procs.free_port()  # outside the ephemeral range: no outgoing connection takes it meanwhile


async def health_at(port: int, service: str) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=2
        )
        return int(reply.status)


async def wait_status(port: int, service: str, status: int, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while True:
            with contextlib.suppress(grpc.aio.AioRpcError):
                if await health_at(port, service) == status:
                    return
            await asyncio.sleep(0.05)
