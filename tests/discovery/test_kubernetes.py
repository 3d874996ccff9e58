"""Kubernetes discovery end to end: the real client code (kubernetes-asyncio, informers, KubeDiscovery) against the
stand-in API server, observed through the EndpointStore and the PolicyStore."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import cast

import pytest
from kubernetes_asyncio import client as kclient

from picker.discovery import kubeobjects, rbac
from picker.discovery import kubernetes as kube
from picker.discovery.kubeapi import KubeApi
from picker.endpoints.model import EndpointSnapshot
from picker.endpoints.policy import PolicyStore, priority_for, resolve_rewrite
from picker.endpoints.store import EndpointStore
from picker.errors import ConfigError
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import eventually, objective, pod, pool, rewrite

pytestmark = pytest.mark.timeout(20)

FAST = kube.KubeSettings(
    pool_name="pool",
    resync_s=30,
    watch_timeout_s=5,
    request_timeout_s=5,
    backoff_initial_s=0.02,
    backoff_max_s=0.1,
    crd_recheck_s=0.1,
)


@dataclass
class Running:
    store: EndpointStore
    policies: PolicyStore
    snapshots: list[EndpointSnapshot]
    discovery: kube.KubeDiscovery | None = None

    def names(self) -> list[str]:
        return [e.name for e in self.store.current()]

    def keys(self) -> list[str]:
        return [e.key for e in self.store.current()]


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


@contextlib.asynccontextmanager
async def discovering(api: FakeApiServer, settings: kube.KubeSettings = FAST) -> AsyncIterator[Running]:
    store, policies = EndpointStore(), PolicyStore()
    running = Running(store, policies, [])
    store.subscribe(running.snapshots.append)

    def started(d: kube.KubeDiscovery) -> None:
        running.discovery = d

    task = asyncio.create_task(
        kube.run(
            store=store,
            policy_store=policies,
            settings=replace(settings, api_server=api.url),
            clock=time.monotonic,
            rng=random.Random(3),
            on_start=started,
        )
    )
    try:
        yield running
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_synced_only_after_the_pool_and_a_full_pod_list(api: FakeApiServer) -> None:
    api.create("pods", pod("p1", "10.0.0.1"))
    api.create("pods", pod("p2", "10.0.0.2"))
    api.fail_next("list", "pods", 500, times=2)
    async with discovering(api) as run:
        await api.wait_watching("inferencepools")
        assert not run.store.current().synced  # no pool yet: nothing published, NOT_SERVING
        assert run.snapshots == []
        assert run.discovery is not None
        assert not run.discovery.synced
        api.create("inferencepools", pool())
        await eventually(lambda: run.store.current().synced)
        assert api.count("list", "pods") == 3  # two failures retried with backoff
        # The first snapshot published is the complete, synced one: never a partial or unsynced set.
        assert run.snapshots[0].synced
        assert [e.name for e in run.snapshots[0]] == ["p1-rank-0", "p2-rank-0"]
        assert run.discovery.synced
        assert run.discovery.serving


async def test_pods_appearing_turning_ready_unready_deleted_and_changing_ip(api: FakeApiServer) -> None:
    api.create("inferencepools", pool())
    api.create("pods", pod("p1", "10.0.0.1"))
    async with discovering(api) as run:
        await eventually(lambda: run.keys() == ["10.0.0.1:8000"])
        ep = run.store.current().endpoints[0]
        assert (ep.name, ep.metrics_url, ep.engine) == ("p1-rank-0", "http://10.0.0.1:8000/metrics", "vllm")
        assert dict(ep.labels) == {"app": "vllm"}

        api.create("pods", pod("p2", None, ready=False))  # scheduled, no IP, not ready
        api.create("pods", pod("p3", "10.0.0.3", labels={"app": "vllm", kubeobjects.ENGINE_LABEL: "sglang"}))
        await eventually(lambda: run.keys() == ["10.0.0.1:8000", "10.0.0.3:8000"])
        assert run.store.current().get("10.0.0.3:8000").engine == "sglang"  # type: ignore[union-attr]

        api.patch("pods", "p2", lambda p: p["status"].update(podIP="10.0.0.2"))
        api.patch("pods", "p2", lambda p: p["status"]["conditions"][0].update(status="True"))
        await eventually(lambda: len(run.keys()) == 3, what="p2 ready")
        assert run.keys() == ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]

        api.patch("pods", "p1", lambda p: p["status"]["conditions"][0].update(status="False"))
        await eventually(lambda: run.names() == ["p2-rank-0", "p3-rank-0"], what="p1 unready")

        api.patch("pods", "p3", lambda p: p["metadata"].update(deletionTimestamp="2025-01-01T00:00:00Z"))
        await eventually(lambda: run.names() == ["p2-rank-0"], what="p3 terminating")
        api.delete("pods", "p3")

        api.patch("pods", "p2", lambda p: p["status"].update(podIP="10.0.0.22"))
        await eventually(lambda: run.keys() == ["10.0.0.22:8000"], what="p2 IP change")

        api.delete("pods", "p2")
        await eventually(lambda: run.keys() == [], what="p2 deleted")
        assert run.store.current().synced  # an empty pool is still a synced pool
        assert api.count("list", "pods") == 1  # all of it from one watch


async def test_target_ports_change_relists_pods_and_ranks_follow(api: FakeApiServer) -> None:
    api.create("inferencepools", pool(ports=(8000,)))
    api.create("pods", pod("p1", "10.0.0.1"))
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["p1-rank-0"])
        two_ports = [{"number": 8000}, {"number": 8001}]
        api.patch("inferencepools", "pool", lambda p: p["spec"].update(targetPorts=two_ports))
        await eventually(lambda: run.names() == ["p1-rank-0", "p1-rank-1"])
        assert run.keys() == ["10.0.0.1:8000", "10.0.0.1:8001"]
        assert api.count("list", "pods") == 2


async def test_selector_change_relists_pods(api: FakeApiServer) -> None:
    api.create("inferencepools", pool(selector={"app": "a"}))
    api.create("pods", pod("pa", "10.0.0.1", labels={"app": "a"}))
    api.create("pods", pod("pb", "10.0.0.2", labels={"app": "b"}))
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["pa-rank-0"])
        api.patch("inferencepools", "pool", lambda p: p["spec"].update(selector={"matchLabels": {"app": "b"}}))
        await eventually(lambda: run.names() == ["pb-rank-0"])
        assert [q["labelSelector"] for v, r, q in api.requests if (v, r) == ("list", "pods")] == ["app=a", "app=b"]


async def test_active_ports_annotation_limits_ranks(api: FakeApiServer) -> None:
    api.create("inferencepools", pool(ports=(8000, 8001, 8002)))
    annotation = kubeobjects.ACTIVE_PORTS_ANNOTATION
    api.create("pods", pod("p1", "10.0.0.1", annotations={annotation: "8001, 9999"}))
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["p1-rank-1"])
        api.patch("pods", "p1", lambda p: p["metadata"]["annotations"].update({annotation: "8000,8002"}))
        await eventually(lambda: run.names() == ["p1-rank-0", "p1-rank-2"])
        api.patch("pods", "p1", lambda p: p["metadata"].pop("annotations"))
        await eventually(lambda: run.names() == ["p1-rank-0", "p1-rank-1", "p1-rank-2"])


async def test_watch_cut_mid_stream_recovers_without_losing_updates(api: FakeApiServer) -> None:
    api.create("inferencepools", pool())
    api.create("pods", pod("p1", "10.0.0.1"))
    api.create("pods", pod("p2", "10.0.0.2"))
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["p1-rank-0", "p2-rank-0"])
        await api.wait_watching("pods")
        api.create("pods", pod("p0", "10.0.0.100"))  # the stream is carrying events when it is cut
        await eventually(lambda: run.names() == ["p0-rank-0", "p1-rank-0", "p2-rank-0"])
        api.cut_watches()
        # These happen while no watch is connected: they must arrive through the re-watch's replay.
        api.delete("pods", "p1")
        api.patch("pods", "p2", lambda p: p["status"].update(podIP="10.0.0.20"))
        api.create("pods", pod("p3", "10.0.0.3"))
        await eventually(lambda: run.keys() == ["10.0.0.100:8000", "10.0.0.20:8000", "10.0.0.3:8000"])
        assert api.count("list", "pods") == 1  # recovered from the last resourceVersion, no relist
        assert api.count("watch", "pods") >= 2


@pytest.mark.parametrize("gone_mode", ["event", "http"])
async def test_gone_relists_and_converges(gone_mode: str) -> None:
    async with FakeApiServer(gone_mode=gone_mode) as api:
        api.create("inferencepools", pool())
        api.create("pods", pod("p1", "10.0.0.1"))
        async with discovering(api) as run:
            await eventually(lambda: run.names() == ["p1-rank-0"])
            await api.wait_watching("pods")
            api.cut_watches()
            api.delete("pods", "p1")
            api.create("pods", pod("p2", "10.0.0.2"))
            api.compact()  # the re-watch's version is now too old: 410
            await eventually(lambda: run.names() == ["p2-rank-0"])
            assert api.count("list", "pods") == 2
            assert run.store.current().synced


async def test_pool_deleted_clears_endpoints_and_unsyncs_then_recreated(api: FakeApiServer) -> None:
    api.create("inferencepools", pool())
    api.create("pods", pod("p1", "10.0.0.1"))
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["p1-rank-0"])
        api.delete("inferencepools", "pool")
        await eventually(lambda: not run.store.current().synced and run.keys() == [])
        api.create("inferencepools", pool(ports=(9000,)))
        await eventually(lambda: run.store.current().synced and run.keys() == ["10.0.0.1:9000"])


async def test_unsupported_app_protocol_is_not_serving(api: FakeApiServer) -> None:
    api.create("inferencepools", pool(app_protocol="grpc"))
    api.create("pods", pod("p1", "10.0.0.1"))
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["p1-rank-0"])
        assert run.discovery is not None
        assert run.discovery.synced
        assert not run.discovery.serving
        assert not run.store.current().synced  # what health serves on
        api.patch("inferencepools", "pool", lambda p: p["spec"].update(appProtocol="kubernetes.io/h2c"))
        await eventually(lambda: run.store.current().synced)
        assert run.discovery.serving
        assert api.count("list", "pods") == 1  # the selector and ports did not change


@pytest.mark.parametrize("pool_group", [kubeobjects.POOL_GROUP, kubeobjects.POOL_GROUP_V1ALPHA2])
def test_every_watched_collection_has_its_rbac_rule(pool_group: str) -> None:
    rules = rbac.rules_for(leader_election=False, pool_group=pool_group)
    granted = {(r.api_group, r.resource) for r in rules if {"list", "watch"} <= set(r.verbs)}
    pool_mode = replace(FAST, pool_group=pool_group)
    standalone = replace(FAST, pool_name="", endpoint_selector=(("a", "b"),), target_ports=(8000,))
    unused = KubeApi(cast(kclient.ApiClient, None))  # nothing is called: watched() only reads the plan
    watched = {
        name: kube.KubeDiscovery(unused, store=EndpointStore(), policy_store=PolicyStore(), settings=s).watched()
        for name, s in (("pool", pool_mode), ("standalone", standalone))
    }
    assert len(watched["pool"]) == 6  # pods, the pool, objectives and rewrites of two groups
    assert (pool_group, "inferencepools") in watched["pool"]
    assert watched["standalone"] == (("", "pods"),)
    for kinds in watched.values():
        assert set(kinds) <= granted
    # Only the pool group in use is granted (as the reference chart derives it from inferencePool.apiVersion).
    assert sum(1 for r in rules if r.resource == "inferencepools") == 1


async def test_repeated_410_on_watch_relists_each_time_and_converges(api: FakeApiServer) -> None:
    api.create("inferencepools", pool())
    api.create("pods", pod("p1", "10.0.0.1"))
    api.fail_next("watch", "pods", 410, times=3)
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["p1-rank-0"])
        await api.wait_watching("pods")
        api.create("pods", pod("p2", "10.0.0.2"))
        await eventually(lambda: run.names() == ["p1-rank-0", "p2-rank-0"])
        assert api.count("list", "pods") == 4


async def test_v1alpha2_pool_group(api: FakeApiServer) -> None:
    old_pool = {"metadata": {"name": "pool"}, "spec": {"selector": {"app": "vllm"}, "targetPortNumber": 8000}}
    api.create("inferencepools.inference.networking.x-k8s.io", old_pool)
    api.create("pods", pod("p1", "10.0.0.1"))
    async with discovering(api, replace(FAST, pool_group="inference.networking.x-k8s.io")) as run:
        await eventually(lambda: run.names() == ["p1-rank-0"])


async def test_crds_absent_then_present_then_removed(api: FakeApiServer) -> None:
    api.set_installed("inferenceobjectives", False)
    api.set_installed("inferencemodelrewrites", False)
    api.create("inferencepools", pool())
    api.create("pods", pod("p1", "10.0.0.1"))
    async with discovering(api) as run:
        await eventually(lambda: run.store.current().synced)  # discovery works without the CRDs
        assert run.policies.current().objectives == {}
        assert run.policies.current().rewrites == ()

        api.set_installed("inferenceobjectives", True)
        api.set_installed("inferencemodelrewrites", True)
        api.create("inferenceobjectives", objective("critical", 10))
        api.create("inferenceobjectives", objective("batch", -1))
        api.create("inferenceobjectives", objective("plain"))
        api.create("inferenceobjectives", objective("foreign", 99, pool_name="other-pool"))
        api.create("inferencemodelrewrites", rewrite("canary", [(["llama"], [("llama-v1", 90), ("llama-v2", 10)])]))
        await eventually(lambda: len(run.policies.current().objectives) == 3 and bool(run.policies.current().rewrites))

        policy = run.policies.current()
        assert dict(policy.objectives) == {"critical": 10, "batch": -1, "plain": None}
        assert [priority_for(policy, n) for n in ("critical", "batch", "plain", "foreign", None)] == [10, -1, 0, 0, 0]
        rng = random.Random(0)
        draws = [resolve_rewrite(policy, "llama", rng) for _ in range(1000)]
        assert {rule for _, rule in draws} == {"canary"}
        share_v2 = sum(1 for target, _ in draws if target == "llama-v2") / len(draws)
        assert 0.06 < share_v2 < 0.14
        assert resolve_rewrite(policy, "mistral", rng) == ("mistral", None)

        api.patch("inferenceobjectives", "critical", lambda o: o["spec"].update(priority=5))
        await eventually(lambda: run.policies.current().objectives.get("critical") == 5)

        api.set_installed("inferenceobjectives", False)
        await eventually(lambda: run.policies.current().objectives == {})
        assert run.policies.current().rewrites  # the other CRD is unaffected
        assert run.store.current().synced


async def test_standalone_selector_mode(api: FakeApiServer) -> None:
    settings = replace(FAST, pool_name="", endpoint_selector=(("app", "vllm"),), target_ports=(8000, 8001))
    api.create("pods", pod("p1", "10.0.0.1"))
    api.create("pods", pod("other", "10.0.0.9", labels={"app": "web"}))
    async with discovering(api, settings) as run:
        await eventually(lambda: run.names() == ["p1-rank-0", "p1-rank-1"])
        api.create("pods", pod("p2", "10.0.0.2"))
        await eventually(lambda: len(run.names()) == 4)
        assert run.store.current().synced
    assert {r for _, r, _ in api.requests} == {"pods"}  # no pool, no CRDs asked for


async def test_unchanged_endpoint_set_is_not_republished(api: FakeApiServer) -> None:
    api.create("inferencepools", pool())
    api.create("pods", pod("p1", "10.0.0.1"))
    async with discovering(api) as run:
        await eventually(lambda: run.names() == ["p1-rank-0"])
        published = len(run.snapshots)
        api.patch("pods", "p1", lambda p: p["spec"].update(nodeName="node-7"))  # irrelevant to endpoints
        api.create("pods", pod("p2", "10.0.0.2"))
        await eventually(lambda: len(run.names()) == 2)
        assert len(run.snapshots) == published + 1


def parse(argv: list[str], environ: dict[str, str] | None = None) -> kube.KubeSettings | None:
    parser = argparse.ArgumentParser()
    kube.configure(parser)
    return kube.settings_from_args(parser.parse_args(argv), environ or {})


def parsed(argv: list[str], environ: dict[str, str] | None = None) -> kube.KubeSettings:
    settings = parse(argv, environ)
    assert settings is not None
    return settings


def test_flags() -> None:
    assert parse([]) is None
    s = parsed(["--pool-name", "p"], {"NAMESPACE": "team"})
    assert (s.pool_name, s.pool_namespace, s.pool_group) == ("p", "team", "inference.networking.k8s.io")
    assert not s.standalone
    assert parsed(["--pool-name", "p", "--pool-namespace", "ns"], {"NAMESPACE": "team"}).pool_namespace == "ns"
    assert parsed(["--pool-name", "p"]).pool_namespace == "default"
    s = parsed(["--endpoint-selector", "app=vllm,tier==gpu", "--endpoint-target-ports", "8001,8000"])
    assert s.standalone
    assert (s.endpoint_selector, s.target_ports) == ((("app", "vllm"), ("tier", "gpu")), (8001, 8000))
    assert parsed(["--pool-name", "p", "--kubeconfig", "/k"]).kubeconfig == "/k"


def test_leader_election_flag() -> None:
    assert not parsed(["--pool-name", "p"]).leader_election
    s = parsed(["--pool-name", "p", "--ha-enable-leader-election"], {"POD_NAME": "epp-0"})
    assert (s.leader_election, s.identity) == (True, "epp-0")
    # controller-runtime's timings
    assert (s.lease_duration_s, s.renew_deadline_s, s.retry_period_s) == (15.0, 10.0, 2.0)
    assert parsed(["--pool-name", "p", "--ha-enable-leader-election=true"]).identity == ""  # no POD_NAME: random
    assert not parsed(["--pool-name", "p", "--ha-enable-leader-election=false"]).leader_election
    with pytest.raises(ConfigError, match="renew deadline"):
        replace(s, renew_deadline_s=15.0).validate()
    with pytest.raises(ConfigError, match="renew deadline"):
        replace(s, retry_period_s=9.0).validate()


@pytest.mark.parametrize(
    "argv",
    [
        ["--pool-name", "p", "--endpoint-selector", "a=b", "--endpoint-target-ports", "1"],
        ["--endpoint-selector", "a=b"],
        ["--endpoint-target-ports", "8000"],
        ["--pool-name", "p", "--endpoint-target-ports", "8000"],
        ["--pool-name", "p", "--pool-group", "example.com"],
        ["--endpoint-selector", "a", "--endpoint-target-ports", "8000"],
        ["--endpoint-selector", "a=b", "--endpoint-target-ports", "0"],
        ["--endpoint-selector", "a=b", "--endpoint-target-ports", "80,80"],
        ["--ha-enable-leader-election"],  # the Lease is named after the pool
        ["--endpoint-selector", "a=b", "--endpoint-target-ports", "8000", "--ha-enable-leader-election"],
    ],
)
def test_bad_flags(argv: list[str]) -> None:
    with pytest.raises(ConfigError):
        parse(argv)
