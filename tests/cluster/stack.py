"""picker and its model servers as processes around the real control plane.

``release`` installs the chart with real helm; ``picker_serve`` runs a real ``picker serve`` authenticated with a
token of the chart's ServiceAccount (``kubectl create token``), so what it may read is what the chart's Role grants
and the API server enforces. ``sims`` runs ``picker sim`` servers on loopback addresses; ``ControlPlane.fake_pod``
gives a pod one of those addresses. ``metrics`` reads a process's Prometheus text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from picker.bench.cluster import ControlPlane
from picker.bench.procs import Child, free_ports, picker_command, spawn, wait_http
from tests.deploy._tools import CHART

RELEASE = "demo"
EPP = f"{RELEASE}-epp"  # the chart's Deployment, Service, ServiceAccount and Role
POOL = RELEASE  # the chart's InferencePool


def helm(cp: ControlPlane, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return cp.helm(*args, check=check)


@contextlib.contextmanager
def namespace(cp: ControlPlane, name: str) -> Iterator[str]:
    cp.create_namespace(name)
    try:
        yield name
    finally:
        helm(cp, "uninstall", RELEASE, "-n", name, check=False)
        cp.delete_namespace(name)


def release(cp: ControlPlane, ns: str, values: Mapping[str, Any], tmp: Path) -> None:
    """``helm install`` the chart into ``ns`` with ``values``."""
    path = tmp / f"values-{ns}.yaml"
    path.write_text(yaml.safe_dump(dict(values)))
    helm(cp, "install", RELEASE, str(CHART), "-n", ns, "-f", str(path))


def pool_values(labels: Mapping[str, str], port: int, **extra: Any) -> dict[str, Any]:
    return {
        "inferencePool": {"modelServers": {"matchLabels": dict(labels)}, "targetPorts": [{"number": port}]},
        "inferenceExtension": {"secureServing": False, **extra},
    }


@dataclass
class Picker:
    child: Child
    host: str
    grpc_port: int
    health_port: int
    metrics_port: int

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def log(self) -> str:
        return self.child.output(10_000_000)

    def records(self) -> list[dict[str, Any]]:
        """Its log records (picker logs one JSON object a line when not on a terminal)."""
        out = []
        for line in self.log().splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    out.append(record)
        return out

    def log_lines(self, needle: str) -> list[dict[str, Any]]:
        """The records whose message contains ``needle``."""
        return [r for r in self.records() if needle in str(r.get("msg", ""))]

    def complaints(self) -> list[dict[str, Any]]:
        """Records at warning level or above."""
        return [r for r in self.records() if r.get("level") in ("warning", "error", "critical")]

    async def metrics(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        return await metrics(f"http://{self.host}:{self.metrics_port}/metrics")

    async def health(self, service: str = "inference-extension") -> int:
        async with grpc.aio.insecure_channel(f"{self.host}:{self.health_port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=5
            )
            return int(reply.status)

    async def endpoints(self) -> set[str]:
        """The endpoints picker discovered (one ``picker_endpoint_metrics_age_seconds`` series each)."""
        samples = (await self.metrics()).get("picker_endpoint_metrics_age_seconds", [])
        return {labels["endpoint"] for labels, _ in samples}


async def metrics(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    async with aiohttp.ClientSession() as session, session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        text = await resp.text()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return out


def sample(series: dict[str, list[tuple[dict[str, str], float]]], name: str, labels: Mapping[str, str]) -> float:
    return sum(v for got, v in series.get(name, []) if labels.items() <= got.items())


@contextlib.asynccontextmanager
async def picker_serve(
    cp: ControlPlane,
    ns: str,
    tmp: Path,
    *args: str,
    host: str = "127.0.0.1",
    service_account: str = EPP,
    env: Mapping[str, str] | None = None,
    name: str = "picker",
    server: str | None = None,
) -> AsyncIterator[Picker]:
    """``picker serve`` for the chart's pool, as ``service_account`` (a token kubeconfig for ``server``, default the
    API server); yields once /metrics answers."""
    kubeconfig = cp.token_kubeconfig(service_account, ns, tmp / f"{name}-{ns}.kubeconfig", server)
    grpc_port, health_port, metrics_port = free_ports(3, hosts=(host,))
    argv = [
        *picker_command(), "serve", "--grace-period", "0s", "--host", host,
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port),
        "--secure-serving=false", "--refresh-metrics-interval", "100ms",
        "--pool-name", POOL, "--pool-namespace", ns, "--kubeconfig", str(kubeconfig), *args,
    ]  # fmt: skip
    environ = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    async with spawn(name, argv, env=environ) as child:
        try:
            await wait_http(f"http://{host}:{metrics_port}/metrics", timeout_s=30, proc=child.proc)
            yield Picker(child, host, grpc_port, health_port, metrics_port)
        except BaseException:
            print(f"--- {name} output:\n{child.output(20000)}")
            raise


@contextlib.asynccontextmanager
async def sims(hosts: Sequence[str], port: int, *extra: str) -> AsyncIterator[dict[str, Child]]:
    """A ``picker sim`` server on each of ``hosts`` at ``port``; yields once all answer."""
    async with contextlib.AsyncExitStack() as stack:
        children = {}
        for host in hosts:
            argv = [*picker_command(), "sim", "--host", host, "--port", str(port), "--preset", "fast", *extra]
            children[host] = await stack.enter_async_context(spawn(f"sim-{host}", argv))
        for host, child in children.items():
            await wait_http(f"http://{host}:{port}/metrics", timeout_s=30, proc=child.proc)
        yield children


async def eventually(check: Callable[[], Any], *, what: str, timeout_s: float = 20.0) -> Any:
    """Await ``check()`` (sync or async) until it is truthy; its value. Fails with ``what`` on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    last: Any = None
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return result
        last = result
        if loop.time() > deadline:
            pytest.fail(f"{what}: not within {timeout_s:g} s (last: {last!r})")
        await asyncio.sleep(0.1)
