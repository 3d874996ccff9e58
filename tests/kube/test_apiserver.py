"""The stand-in API server speaks the list/watch wire protocol the way a real apiserver does (raw aiohttp client)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest

from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import objective, pod

PODS = "/api/v1/namespaces/default/pods"
OBJECTIVES = "/apis/inference.networking.x-k8s.io/v1alpha2/namespaces/default/inferenceobjectives"

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with http.get(url) as resp:
        return resp.status, orjson.loads(await resp.read())


async def read_events(resp: aiohttp.ClientResponse, n: int) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for _ in range(n):
        line = await resp.content.readline()
        assert line, f"stream ended after {len(events)} events"
        events.append(orjson.loads(line))
    return events


def names(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


async def test_list_filters_by_label_and_field_selector_and_carries_the_resource_version(
    api: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    api.create("pods", pod("a", labels={"app": "vllm", "tier": "1"}))
    api.create("pods", pod("b", labels={"app": "other"}))
    api.create("pods", pod("c", namespace="elsewhere"))
    code, body = await get_json(http, f"{api.url}{PODS}?labelSelector=app%3Dvllm")
    assert code == 200
    assert body["kind"] == "PodList"
    assert body["metadata"]["resourceVersion"] == str(api.rv)
    assert [i["metadata"]["name"] for i in body["items"]] == ["a"]
    _, body = await get_json(http, f"{api.url}{PODS}?labelSelector=app!%3Dvllm,!tier")
    assert [i["metadata"]["name"] for i in body["items"]] == ["b"]
    _, body = await get_json(http, f"{api.url}{PODS}?fieldSelector=metadata.name%3Db")
    assert [i["metadata"]["name"] for i in body["items"]] == ["b"]
    code, body = await get_json(http, f"{api.url}{PODS}?fieldSelector=spec.nodeName%3Dx")
    assert (code, body["reason"]) == (400, "BadRequest")


async def test_get_by_name_and_404s(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    created = api.create("pods", pod("a"))
    code, body = await get_json(http, f"{api.url}{PODS}/a")
    assert code == 200
    assert body["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    code, body = await get_json(http, f"{api.url}{PODS}/missing")
    assert (code, body["kind"], body["reason"]) == (404, "Status", "NotFound")


async def test_resource_version_is_one_global_counter(api: FakeApiServer) -> None:
    a = api.create("pods", pod("a"))
    o = api.create("inferenceobjectives", objective("o"))
    a2 = api.patch("pods", "a", lambda p: p["metadata"]["labels"].update(x="y"))
    assert [int(x["metadata"]["resourceVersion"]) for x in (a, o, a2)] == [1001, 1002, 1003]
    assert a2["metadata"]["uid"] == a["metadata"]["uid"]


async def test_watch_replays_from_a_version_then_streams_live_with_selector_transitions(
    api: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    api.create("pods", pod("a"))
    rv = api.rv
    api.create("pods", pod("b"))
    api.create("pods", pod("skip", labels={"app": "other"}))
    url = f"{api.url}{PODS}?watch=true&resourceVersion={rv}&labelSelector=app%3Dvllm&timeoutSeconds=10"
    async with http.get(url) as resp:
        assert resp.status == 200
        await api.wait_watching("pods")
        api.patch("pods", "a", lambda p: p["metadata"]["labels"].update(app="other"))  # leaves the selector
        api.patch("pods", "skip", lambda p: p["metadata"]["labels"].update(app="vllm"))  # enters it
        api.patch("pods", "b", lambda p: p["status"].update(podIP="10.0.0.9"))
        api.delete("pods", "b")
        events = await read_events(resp, 5)
    assert names(events) == [("ADDED", "b"), ("DELETED", "a"), ("ADDED", "skip"), ("MODIFIED", "b"), ("DELETED", "b")]
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs)


async def test_watch_without_a_version_starts_with_synthetic_adds(
    api: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    api.create("pods", pod("a"))
    api.create("pods", pod("b"))
    async with http.get(f"{api.url}{PODS}?watch=1&timeoutSeconds=5") as resp:
        assert names(await read_events(resp, 2)) == [("ADDED", "a"), ("ADDED", "b")]


async def test_watch_ends_cleanly_after_timeout_seconds(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{api.url}{PODS}?watch=true&resourceVersion={api.rv}&timeoutSeconds=1") as resp:
        assert await resp.read() == b""  # a clean end of the chunked body, no error


async def test_bookmarks_only_when_allowed(http: aiohttp.ClientSession) -> None:
    async with FakeApiServer(bookmark_interval_s=0.05) as api:
        api.create("pods", pod("a"))
        url = f"{api.url}{PODS}?watch=true&resourceVersion={api.rv}&allowWatchBookmarks=true&timeoutSeconds=5"
        async with http.get(url) as resp:
            (event,) = await read_events(resp, 1)
            assert event["type"] == "BOOKMARK"
            assert event["object"]["metadata"] == {"resourceVersion": str(api.rv)}
        async with http.get(f"{api.url}{PODS}?watch=true&resourceVersion={api.rv}&timeoutSeconds=1") as resp:
            assert await resp.read() == b""


async def test_send_bookmarks_carries_the_version_at_the_time_it_was_queued(
    api: FakeApiServer, http: aiohttp.ClientSession
) -> None:
    url = f"{api.url}{PODS}?watch=true&resourceVersion={api.rv}&allowWatchBookmarks=true&timeoutSeconds=5"
    async with http.get(url) as resp:
        await api.wait_watching("pods")
        api.create("pods", pod("a"))
        api.send_bookmarks()
        api.create("pods", pod("b"))
        events = await read_events(resp, 3)
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK", "ADDED"]
    assert events[1]["object"]["metadata"]["resourceVersion"] == events[0]["object"]["metadata"]["resourceVersion"]


async def test_compacted_version_is_gone_as_an_error_event(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    api.create("pods", pod("a"))
    old = api.rv
    api.create("pods", pod("b"))
    api.compact()
    async with http.get(f"{api.url}{PODS}?watch=true&resourceVersion={old}") as resp:
        assert resp.status == 200
        (event,) = await read_events(resp, 1)
        assert await resp.content.readline() == b""
    assert event["type"] == "ERROR"
    assert (event["object"]["code"], event["object"]["reason"]) == (410, "Expired")
    # A version at or after the compaction point still works.
    async with http.get(f"{api.url}{PODS}?watch=true&resourceVersion={api.rv}&timeoutSeconds=1") as resp:
        assert await resp.read() == b""


async def test_compacted_version_is_gone_as_http_410(http: aiohttp.ClientSession) -> None:
    async with FakeApiServer(gone_mode="http") as api:
        api.create("pods", pod("a"))
        old = api.rv
        api.create("pods", pod("b"))
        api.compact()
        code, body = await get_json(http, f"{api.url}{PODS}?watch=true&resourceVersion={old}")
        assert (code, body["code"], body["reason"]) == (410, 410, "Expired")
        code, body = await get_json(http, f"{api.url}{PODS}?resourceVersion={old}&resourceVersionMatch=Exact")
        assert code == 410


async def test_expire_watches_sends_410_to_open_watches(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{api.url}{PODS}?watch=true&resourceVersion={api.rv}") as resp:
        await api.wait_watching("pods")
        assert api.expire_watches() == 1
        (event,) = await read_events(resp, 1)
    assert (event["type"], event["object"]["code"]) == ("ERROR", 410)


async def test_cut_watches_aborts_the_stream_mid_body(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    async with http.get(f"{api.url}{PODS}?watch=true&resourceVersion={api.rv}") as resp:
        await api.wait_watching("pods")
        api.create("pods", pod("a"))
        assert names(await read_events(resp, 1)) == [("ADDED", "a")]
        assert api.cut_watches() == 1
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.content.readline()


async def test_uninstalled_crd_is_404_and_ends_its_watches(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    api.create("inferenceobjectives", objective("o"))
    async with http.get(f"{api.url}{OBJECTIVES}?watch=true&resourceVersion={api.rv}") as resp:
        await api.wait_watching("inferenceobjectives")
        api.set_installed("inferenceobjectives", False)
        assert await resp.read() == b""
    code, body = await get_json(http, f"{api.url}{OBJECTIVES}")
    assert (code, body["reason"]) == (404, "NotFound")
    code, _ = await get_json(http, f"{api.url}{OBJECTIVES}?watch=true")
    assert code == 404
    with pytest.raises(LookupError):
        api.create("inferenceobjectives", objective("o"))
    api.set_installed("inferenceobjectives", True)
    _, body = await get_json(http, f"{api.url}{OBJECTIVES}")
    assert body["items"] == []  # uninstalling a CRD deletes its objects


async def test_injected_failures_and_unmodelled_pagination(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    api.fail_next("list", "pods", 503, times=2)
    assert (await get_json(http, f"{api.url}{PODS}"))[0] == 503
    assert (await get_json(http, f"{api.url}{PODS}"))[0] == 503
    assert (await get_json(http, f"{api.url}{PODS}"))[0] == 200
    assert (await get_json(http, f"{api.url}{PODS}?limit=10"))[0] == 400
    assert api.count("list", "pods") == 4


async def test_writes_over_http_reach_watches(api: FakeApiServer, http: aiohttp.ClientSession) -> None:
    leases = f"{api.url}/apis/coordination.k8s.io/v1/namespaces/default/leases"
    async with http.get(f"{leases}?watch=true&resourceVersion={api.rv}") as watch:
        body = {"metadata": {"generateName": "l-"}, "spec": {"holderIdentity": "a"}}
        async with http.post(leases, data=orjson.dumps(body)) as resp:
            assert resp.status == 201
            created = orjson.loads(await resp.read())
        name = created["metadata"]["name"]
        assert name.startswith("l-")
        assert created["kind"] == "Lease"
        async with http.put(f"{leases}/{name}", data=orjson.dumps(created)) as resp:
            assert resp.status == 200
        async with http.put(f"{leases}/{name}", data=orjson.dumps(created)) as resp:  # its version is stale now
            assert resp.status == 409
            assert orjson.loads(await resp.read())["reason"] == "Conflict"
        async with http.put(f"{leases}/other", data=orjson.dumps({"metadata": {"name": "other"}})) as resp:
            assert resp.status == 404
        async with http.delete(f"{leases}/{name}") as resp:
            assert resp.status == 200
            assert orjson.loads(await resp.read())["status"] == "Success"
        async with http.delete(f"{leases}/{name}") as resp:
            assert resp.status == 404
        events = await read_events(watch, 3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    assert api.verbs("leases") == {"watch", "create", "update", "delete"}
