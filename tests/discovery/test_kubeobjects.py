"""Pure conversions: InferencePool → PoolSpec, pods → endpoints, objectives/rewrites → PoolPolicy, flag parsing."""

from __future__ import annotations

from typing import Any

import pytest

from picker.discovery import kubeobjects as ko
from picker.endpoints.policy import RewriteTarget
from picker.errors import ConfigError
from tests.kube.objects import objective, pod, pool, rewrite


def test_parse_pool_v1() -> None:
    spec = ko.parse_pool(pool(selector={"b": "2", "a": "1"}, ports=(8001, 8000)))
    assert spec == ko.PoolSpec((("a", "1"), ("b", "2")), (8001, 8000), "http")
    assert spec.app_protocol_supported
    assert not ko.parse_pool(pool(app_protocol="grpc")).app_protocol_supported
    assert ko.parse_pool(pool(app_protocol="kubernetes.io/h2c")).app_protocol_supported


def test_parse_pool_v1alpha2_shape() -> None:
    obj = {"metadata": {"name": "p"}, "spec": {"selector": {"app": "x"}, "targetPortNumber": 9000}}
    assert ko.parse_pool(obj) == ko.PoolSpec((("app", "x"),), (9000,))


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"selector": {"matchLabels": {}}, "targetPorts": [{"number": 8000}]},
        {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": []},
        {"selector": {"matchLabels": {"a": "b"}}, "targetPorts": [{"number": 0}, {"number": "x"}]},
        {"selector": {"matchExpressions": [{"key": "a", "operator": "Exists"}]}, "targetPorts": [{"number": 1}]},
    ],
)
def test_unusable_pools(spec: dict[str, Any]) -> None:
    with pytest.raises(ko.InvalidPool):
        ko.parse_pool({"metadata": {"name": "p"}, "spec": spec})


def test_duplicate_ports_are_dropped_keeping_rank_order() -> None:
    obj = pool(ports=(8000, 8001, 8000))
    assert ko.parse_pool(obj).target_ports == (8000, 8001)


@pytest.mark.parametrize(
    ("obj", "ready"),
    [
        (pod("p"), True),
        (pod("p", ready=False), False),
        (pod("p", None), False),
        (pod("p", deleting=True), False),
        ({"metadata": {"name": "p"}, "status": {"podIP": "10.0.0.1"}}, False),  # no Ready condition yet
    ],
)
def test_pod_readiness(obj: dict[str, Any], ready: bool) -> None:
    assert ko.pod_is_ready(obj) is ready


def test_endpoints_per_active_port_with_rank_names() -> None:
    pods = [
        pod("b", "10.0.0.2", annotations={ko.ACTIVE_PORTS_ANNOTATION: "8002,8000,junk"}),
        pod("a", "10.0.0.1", labels={"app": "x", ko.ENGINE_LABEL: "trtllm"}),
        pod("c", "10.0.0.3", annotations={ko.ACTIVE_PORTS_ANNOTATION: ""}),  # annotated: no port active
        pod("d", "10.0.0.4", annotations={"llm-d.ai/active-ports": "8001"}),
        pod("e", "10.0.0.5", ready=False),
    ]
    eps = ko.endpoints_for(pods, (8000, 8001, 8002))
    assert [(e.name, e.key) for e in eps] == [
        ("a-rank-0", "10.0.0.1:8000"),
        ("a-rank-1", "10.0.0.1:8001"),
        ("a-rank-2", "10.0.0.1:8002"),
        ("b-rank-0", "10.0.0.2:8000"),
        ("b-rank-2", "10.0.0.2:8002"),
        ("d-rank-1", "10.0.0.4:8001"),
    ]
    assert eps[0].engine == "trtllm"
    assert eps[3].engine == "vllm"
    assert eps[0].metrics_url == "http://10.0.0.1:8000/metrics"
    assert dict(eps[0].labels) == {"app": "x", ko.ENGINE_LABEL: "trtllm"}


def test_ipv6_pod() -> None:
    (ep,) = ko.endpoints_for([pod("v6", "fd00::1")], (8000,))
    assert ep.key == "[fd00::1]:8000"
    assert ep.metrics_url == "http://[fd00::1]:8000/metrics"


def test_two_pods_claiming_one_ip_keep_one_endpoint() -> None:
    eps = ko.endpoints_for([pod("new", "10.0.0.1"), pod("old", "10.0.0.1")], (8000,))
    assert [e.name for e in eps] == ["new-rank-0"]


def test_pod_endpoints_index_updates_one_pod_at_a_time() -> None:
    index = ko.PodEndpoints((8000,))
    assert index.reset([pod("b", "10.0.0.2"), pod("a", "10.0.0.1")])
    first = index.endpoints()
    assert [e.name for e in first] == ["a-rank-0", "b-rank-0"]
    assert not index.reset([pod("a", "10.0.0.1"), pod("b", "10.0.0.2")])  # same pods: no change
    assert not index.update("a", pod("a", "10.0.0.1", annotations={"unrelated": "x"}))
    assert not index.update("ghost", None)
    assert not index.update("pending", pod("pending", None))
    assert index.endpoints() is first  # unchanged: the very same tuple
    assert index.update("a", pod("a", "10.0.0.1", ready=False))
    assert [e.name for e in index.endpoints()] == ["b-rank-0"]
    assert index.update("c", pod("c", "10.0.0.2"))  # claims b's address: b (first by name) keeps it
    assert [e.name for e in index.endpoints()] == ["b-rank-0"]
    assert index.update("b", None)
    assert [e.name for e in index.endpoints()] == ["c-rank-0"]
    assert index.update("c", pod("c", "10.0.0.2", labels={"app": "vllm", "v": "2"}))  # labels are part of it
    assert dict(index.endpoints()[0].labels) == {"app": "vllm", "v": "2"}


def test_pool_ref_matching() -> None:
    assert ko.pool_ref_matches(objective("o"), "pool", ko.POOL_GROUP)
    assert not ko.pool_ref_matches(objective("o", pool_name="other"), "pool", ko.POOL_GROUP)
    assert not ko.pool_ref_matches(objective("o"), "pool", ko.POOL_GROUP_V1ALPHA2)
    bare = {"metadata": {"name": "o"}, "spec": {"poolRef": {"name": "pool"}}}
    assert ko.pool_ref_matches(bare, "pool", ko.POOL_GROUP)
    wrong_kind = {"metadata": {"name": "o"}, "spec": {"poolRef": {"name": "pool", "kind": "Service"}}}
    assert not ko.pool_ref_matches(wrong_kind, "pool", ko.POOL_GROUP)


def test_build_policy() -> None:
    rw = rewrite("r", [(["a", "b"], [("a2", 3), ("a3", 1)]), ([], [("default", 0)])], created="2025-03-01T10:00:00Z")
    bogus = {"metadata": {"name": "x"}, "spec": {"poolRef": {"name": "pool"}, "rules": [{"matches": [{}]}, "junk"]}}
    policy = ko.build_policy(
        [objective("hi", 7), objective("no"), objective("bad", None), objective("elsewhere", 1, pool_name="q")],
        [rw, bogus, rewrite("foreign", [([], [("z", 0)])], pool_name="q")],
        pool_name="pool",
        pool_group=ko.POOL_GROUP,
    )
    assert dict(policy.objectives) == {"hi": 7, "no": None, "bad": None}
    assert [(r.rewrite_name, r.index, sorted(r.models)) for r in policy.rewrites] == [
        ("r", 0, ["a", "b"]),
        ("r", 1, []),
    ]
    assert policy.rewrites[0].targets == (RewriteTarget("a2", 3), RewriteTarget("a3", 1))
    assert policy.rewrites[0].created_at == ko.parse_timestamp("2025-03-01T10:00:00Z")


def test_parse_timestamp() -> None:
    assert ko.parse_timestamp("1970-01-01T00:01:00Z") == 60.0
    assert ko.parse_timestamp(None) == float("inf")
    assert ko.parse_timestamp("yesterday") == float("inf")


def test_parse_selector_and_ports() -> None:
    assert ko.parse_selector(" b=2, a==1 ,") == (("a", "1"), ("b", "2"))
    assert ko.parse_selector("example.com/role=") == (("example.com/role", ""),)
    assert ko.format_selector(ko.parse_selector("b=2,a=1")) == "a=1,b=2"
    assert ko.parse_ports("8001, 8000") == (8001, 8000)


@pytest.mark.parametrize("text", ["", "a", "a!=b", "a=b,a=c", "-bad=x", "a=has space"])
def test_bad_selectors(text: str) -> None:
    with pytest.raises(ConfigError):
        ko.parse_selector(text)


@pytest.mark.parametrize("text", ["", "x", "0", "65536", "1,1", "1,2,3,4,5,6,7,8,9"])
def test_bad_ports(text: str) -> None:
    with pytest.raises(ConfigError):
        ko.parse_ports(text)
