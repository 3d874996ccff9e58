from __future__ import annotations

from picker.endpoints.model import Endpoint, EndpointMetrics, format_hostport
from picker.endpoints.store import EndpointStore


def test_hostport_brackets_ipv6() -> None:
    assert format_hostport("10.0.0.1", 8000) == "10.0.0.1:8000"
    assert format_hostport("fd00::1", 8000) == "[fd00::1]:8000"


def test_membership_change_keeps_metrics_of_staying_endpoints() -> None:
    store = EndpointStore()
    a, b = Endpoint.create("10.0.0.1", 8000), Endpoint.create("10.0.0.2", 8000)
    store.set_endpoints([a, b])
    store.update_metrics({a.key: EndpointMetrics(waiting=7, updated_at=1.0)})
    store.set_endpoints([a, Endpoint.create("10.0.0.3", 8000)])
    snap = store.current()
    kept = snap.get(a.key)
    assert kept is not None
    assert kept.metrics.waiting == 7
    assert snap.get(b.key) is None
    assert snap.version == 3


def test_candidates_fall_back_to_all_when_all_excluded() -> None:
    store = EndpointStore()
    a, b = Endpoint.create("10.0.0.1", 8000), Endpoint.create("10.0.0.2", 8000)
    store.set_endpoints([a, b])
    store.set_excluded({a.key: True})
    assert [e.key for e in store.current().candidates()] == [b.key]
    store.set_excluded({b.key: True})
    assert {e.key for e in store.current().candidates()} == {a.key, b.key}


def test_listeners_see_every_published_snapshot() -> None:
    store = EndpointStore()
    seen: list[int] = []
    store.subscribe(lambda s: seen.append(s.version))
    store.set_endpoints([Endpoint.create("10.0.0.1", 8000)])
    store.set_excluded({"10.0.0.1:8000": True})
    store.set_excluded({"10.0.0.1:8000": True})  # no change, no publish
    assert seen == [1, 2]
