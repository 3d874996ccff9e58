"""picker as the chart's ServiceAccount against the real API server: discovery, policy objects, RBAC, leases, peers.

Each test installs the chart with real helm into its own namespace, then runs a real ``picker serve`` with a token of
the chart's ServiceAccount: every list and watch picker makes is authorized by the chart's Role, as in a cluster.
The model servers are ``picker sim`` processes on loopback addresses, and the pods that name them are faked through
the API (``ControlPlane.fake_pod``).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from grpc_health.v1 import health_pb2

from picker.bench.cluster import ControlPlane
from picker.discovery.leaderelection import lease_name
from picker.procutil import free_ports
from tests.cluster.stack import (
    EPP,
    POOL,
    Picker,
    eventually,
    namespace,
    picker_serve,
    pool_values,
    release,
    sample,
    sims,
)
from tests.extproc.gateway import Gateway

pytestmark = pytest.mark.timeout(180)

SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
LABELS = {"app": "sim"}
OBJECTIVE_GROUPS = {"x": "inference.networking.x-k8s.io/v1alpha2", "llmd": "llm-d.ai/v1alpha2"}


def objective(api_version: str, name: str, priority: int) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "InferenceObjective",
        "metadata": {"name": name},
        "spec": {"poolRef": {"name": POOL}, "priority": priority},
    }


def rewrite(api_version: str, name: str, model: str, target: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "InferenceModelRewrite",
        "metadata": {"name": name},
        "spec": {
            "poolRef": {"name": POOL},
            "rules": [{"matches": [{"model": {"value": model}}], "targets": [{"modelRewrite": target}]}],
        },
    }


async def route(gateway: Gateway, model: str, headers: dict[str, str] | None = None) -> tuple[str, str]:
    """One completion through picker's ext_proc: (destination, model in the body sent upstream)."""
    body = orjson.dumps({"model": model, "prompt": "hello", "max_tokens": 1})
    outcome = await gateway.request(
        {":method": "POST", ":path": "/v1/completions", "content-type": "application/json", **(headers or {})}, [body]
    )
    assert outcome.routed, (outcome.status, outcome.error_body)
    assert outcome.destination is not None
    assert outcome.upstream_body is not None
    return outcome.destination, str(orjson.loads(outcome.upstream_body)["model"])


async def test_discovers_pool_pods_and_both_groups_policies(control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    (port,) = free_ports(1, hosts=HOSTS)
    with namespace(cp, "discovery") as ns:
        release(cp, ns, pool_values(LABELS, port), tmp_path)
        cp.apply(objective(OBJECTIVE_GROUPS["x"], "premium", 5), namespace=ns)
        cp.apply(objective(OBJECTIVE_GROUPS["llmd"], "batch", -1), namespace=ns)
        cp.apply(rewrite(OBJECTIVE_GROUPS["x"], "legacy", "old-llama", "llama-v1"), namespace=ns)
        cp.apply(rewrite(OBJECTIVE_GROUPS["llmd"], "canary", "llama", "llama-v2"), namespace=ns)
        async with sims(HOSTS, port):
            cp.fake_pod(ns, "p1", LABELS, HOSTS[0])
            cp.fake_pod(ns, "p2", LABELS, HOSTS[1])
            cp.fake_pod(ns, "p3", LABELS, HOSTS[2], ready=False)
            cp.fake_pod(ns, "other", {"app": "other"}, "127.0.0.5")
            async with picker_serve(cp, ns, tmp_path) as p:
                key = {name: f"{ip}:{port}" for name, ip in zip(("p1", "p2", "p3"), HOSTS, strict=True)}
                await eventually(lambda: p.health(), what="picker serving")
                assert await eventually(p.endpoints, what="endpoints") == {key["p1"], key["p2"]}

                gateway = Gateway(p.grpc_target)
                try:
                    # Rewrites of both groups, and objectives of both groups (priority on the reference metric).
                    dest, model = await route(gateway, "llama", {"x-gateway-inference-objective": "batch"})
                    assert model == "llama-v2"
                    assert dest in (key["p1"], key["p2"])
                    _, model = await route(gateway, "old-llama", {"x-gateway-inference-objective": "premium"})
                    assert model == "llama-v1"
                    series = await p.metrics()
                    name = "inference_objective_request_total"
                    assert sample(series, name, {"target_model_name": "llama-v2", "priority": "-1"}) == 1
                    assert sample(series, name, {"target_model_name": "llama-v1", "priority": "5"}) == 1
                finally:
                    await gateway.close()

                # Readiness and deletion reach picker through the watch.
                cp.set_pod_status(ns, "p3", HOSTS[2], ready=True)
                await eventually(lambda: _has(p, key["p3"]), what="p3 joined")
                cp.kubectl("delete", "pod", "p1", "-n", ns, "--grace-period=0", "--force")
                await eventually(lambda: _lacks(p, key["p1"]), what="p1 left")
                assert await p.endpoints() == {key["p2"], key["p3"]}
                assert p.complaints() == []  # every CRD installed, every rule granted: nothing to complain about


async def _has(p: Picker, key: str) -> bool:
    return key in await p.endpoints()


async def _lacks(p: Picker, key: str) -> bool:
    return key not in await p.endpoints()


async def test_absent_crd_is_reported_once_and_picked_up_when_installed(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    cp = control_plane
    crd = "inferenceobjectives.llm-d.ai"
    (port,) = free_ports(1, hosts=HOSTS[:1])
    cp.uninstall_crd(crd)
    try:
        with namespace(cp, "absent-crd") as ns:
            release(cp, ns, pool_values(LABELS, port), tmp_path)
            async with sims(HOSTS[:1], port):
                cp.fake_pod(ns, "p1", LABELS, HOSTS[0])
                async with picker_serve(cp, ns, tmp_path, "--crd-recheck-interval", "1s") as p:
                    await eventually(lambda: p.health(), what="picker serving")
                    await asyncio.sleep(3.5)  # three re-checks of the absent CRD
                    absent = p.log_lines(f"{crd} in {ns} is not installed")
                    assert len(absent) == 1, p.log()
                    assert absent[0]["level"] == "info"
                    assert p.complaints() == []  # a real API server's plain-text 404 is "absent", not an error

                    cp.install_crds([crd])
                    cp.apply(objective(OBJECTIVE_GROUPS["llmd"], "late", 7), namespace=ns)
                    await eventually(lambda: p.log_lines(f"{crd} in {ns} is now available"), what="CRD picked up")
                    gateway = Gateway(p.grpc_target)
                    try:

                        async def counted() -> bool:
                            await route(gateway, "m", {"x-gateway-inference-objective": "late"})
                            series = await p.metrics()
                            return sample(series, "inference_objective_request_total", {"priority": "7"}) > 0

                        await eventually(counted, what="the new objective's priority applied")
                    finally:
                        await gateway.close()
                    # Installing a CRD re-initializes the API server's storage of the others for a moment (429):
                    # a retry at warning level then is right. Nothing else may have been complained about.
                    assert [c for c in p.complaints() if "(re)initializing" not in c["msg"]] == []
    finally:
        cp.install_crds([crd])


async def test_a_rule_the_role_lacks_fails_loudly_once(control_plane: ControlPlane, tmp_path: Path) -> None:
    """A Role without the llm-d.ai rule (as the chart had before): one clear error per collection, no loop; and a
    Role without pods: one error, and picker is not ready."""
    cp = control_plane
    (port,) = free_ports(1, hosts=HOSTS[:1])
    with namespace(cp, "forbidden") as ns:
        release(cp, ns, pool_values(LABELS, port), tmp_path)
        role = cp.get("role", EPP, "-n", ns)
        for rule in role["rules"]:
            rule["apiGroups"] = [g for g in rule["apiGroups"] if g != "llm-d.ai"]
        cp.kubectl("replace", "-f", "-", stdin=json.dumps(role))
        async with sims(HOSTS[:1], port):
            cp.fake_pod(ns, "p1", LABELS, HOSTS[0])
            async with picker_serve(cp, ns, tmp_path) as p:
                await eventually(lambda: p.health(), what="picker serving without llm-d.ai")
                await asyncio.sleep(5)  # the backoff's cap is 4 s: a loop would have logged again by now
                errors = p.log_lines("FORBIDDEN")
                assert sorted(e["msg"].split("may not list ")[1].split(" ")[0] for e in errors) == [
                    "inferencemodelrewrites.llm-d.ai",
                    "inferenceobjectives.llm-d.ai",
                ], p.log()
                assert all(e["level"] == "error" for e in errors)
                assert all("API group 'llm-d.ai'" in e["msg"] for e in errors)

        role["rules"] = [r for r in role["rules"] if "pods" not in r["resources"]]
        role["metadata"].pop("resourceVersion", None)
        cp.kubectl("replace", "-f", "-", stdin=json.dumps(role))
        async with picker_serve(cp, ns, tmp_path, name="picker-nopods") as p:
            await eventually(lambda: p.log_lines("may not list pods"), what="the pods error")
            assert await p.health() == NOT_SERVING
            await asyncio.sleep(5)
            assert len(p.log_lines("may not list pods")) == 1


async def test_leader_election_on_a_real_lease(control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    (port,) = free_ports(1, hosts=HOSTS[:1])
    with namespace(cp, "leader") as ns:
        release(cp, ns, pool_values(LABELS, port, replicas=2), tmp_path)
        async with sims(HOSTS[:1], port):
            cp.fake_pod(ns, "p1", LABELS, HOSTS[0])
            lease = lease_name(ns, POOL)
            async with (
                picker_serve(cp, ns, tmp_path, "--ha-enable-leader-election", env={"POD_NAME": "a"}, name="a") as a,
                picker_serve(cp, ns, tmp_path, "--ha-enable-leader-election", env={"POD_NAME": "b"}, name="b") as b,
            ):

                def holder() -> str:
                    proc = cp.kubectl("get", "lease", lease, "-n", ns, "-o", "json", check=False)
                    return json.loads(proc.stdout)["spec"].get("holderIdentity", "") if proc.returncode == 0 else ""

                first = await eventually(holder, what="a leader")
                leader, standby = (a, b) if first == "a" else (b, a)
                await eventually(lambda: _serving(leader, "readiness"), what="the leader ready")
                assert await standby.health("readiness") == NOT_SERVING
                assert await standby.health("liveness") == SERVING
                await leader.child.stop(10)  # SIGTERM: the leader releases the Lease on its way out
                await eventually(lambda: holder() == ("b" if first == "a" else "a"), what="the standby took over")
                await eventually(lambda: _serving(standby, "readiness"), what="the new leader ready")


async def _serving(p: Picker, service: str) -> bool:
    return await p.health(service) == SERVING


async def test_active_active_reads_its_services_endpointslices(control_plane: ControlPlane, tmp_path: Path) -> None:
    """With the chart's active-active Role picker lists and watches its Service's real EndpointSlices without a
    refusal. They hold no address here: EndpointSlice validation refuses loopback addresses, the only ones a test
    may use, so the peer links themselves are tested against the stand-in (tests/peers, tests/e2e)."""
    cp = control_plane
    (port,) = free_ports(1, hosts=HOSTS[:1])
    with namespace(cp, "peers") as ns:
        (peer_port,) = free_ports(1)
        values = pool_values(
            LABELS,
            port,
            replicas=2,
            activeActive=True,
            peerPort=peer_port,
            strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        )
        release(cp, ns, values, tmp_path)
        async with sims(HOSTS[:1], port):
            cp.fake_pod(ns, "p1", LABELS, HOSTS[0])
            args = ("--peer-service", EPP, "--peer-port", str(peer_port))
            async with picker_serve(cp, ns, tmp_path, *args) as p:
                await eventually(lambda: p.health(), what="picker serving")
                await asyncio.sleep(2)
                assert sample(await p.metrics(), "picker_peer_links", {"state": "configured"}) == 0
                assert p.complaints() == []
