"""Informer and KubeApi against the stand-in API server: list-then-watch, bookmarks, 410, absent CRDs, backoff."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import pytest
from kubernetes_asyncio import client as kclient

from picker.discovery.informer import Informer, InformerTiming, backoff_delay
from picker.discovery.kubeapi import KubeApi, KubeApiError, Resource, ResourceGone, ResourceNotFound, connect
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import eventually, objective, pod

pytestmark = pytest.mark.timeout(20)

PODS = Resource("", "v1", "pods", "default", label_selector="app=vllm")
OBJECTIVES = Resource("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "default")
FAST = InformerTiming(resync_s=30, watch_timeout_s=5, backoff_initial_s=0.02, backoff_max_s=0.1, absent_recheck_s=0.1)


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


@pytest.fixture
async def kube(api: FakeApiServer) -> AsyncIterator[KubeApi]:
    async with connect(api_server=api.url) as client:
        yield KubeApi(client, request_timeout_s=5)


@contextlib.asynccontextmanager
async def running(kube: KubeApi, resource: Resource, timing: InformerTiming = FAST) -> AsyncIterator[Informer]:
    changes: list[str | None] = []
    informer = Informer(
        kube,
        resource,
        on_change=lambda inf, name: changes.append(name),
        timing=timing,
        clock=time.monotonic,
        rng=random.Random(7),
    )
    task = asyncio.create_task(informer.run())
    try:
        yield informer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_kube_api_list_and_errors(api: FakeApiServer, kube: KubeApi) -> None:
    api.create("pods", pod("a"))
    listed = await kube.list(PODS)
    assert [i["metadata"]["name"] for i in listed.items] == ["a"]
    assert listed.resource_version == str(api.rv)
    api.set_installed("inferenceobjectives", False)
    with pytest.raises(ResourceNotFound):
        await kube.list(OBJECTIVES)
    api.fail_next("list", "pods", 500)
    with pytest.raises(KubeApiError) as err:
        await kube.list(PODS)
    assert err.value.status == 500


async def test_kube_api_watch_raises_gone_on_an_error_event(api: FakeApiServer, kube: KubeApi) -> None:
    api.create("pods", pod("a"))
    old = api.rv
    api.create("pods", pod("b"))
    api.compact()
    with pytest.raises(ResourceGone):
        async for _ in kube.watch(PODS, str(old), 5):
            pass


async def test_kube_api_transport_errors_are_kube_api_errors() -> None:
    async with FakeApiServer() as api:
        url = api.url
    async with connect(api_server=url) as client:  # nothing listens there any more
        with pytest.raises(KubeApiError) as err:
            await KubeApi(client, request_timeout_s=2).list(PODS)
    assert err.value.status == 0


async def test_informer_lists_then_follows_events(api: FakeApiServer, kube: KubeApi) -> None:
    api.create("pods", pod("a"))
    async with running(kube, PODS) as informer:
        await eventually(lambda: informer.synced and set(informer.items) == {"a"})
        api.create("pods", pod("b"))
        api.patch("pods", "a", lambda p: p["metadata"]["labels"].update(app="other"))  # leaves the selector
        await eventually(lambda: set(informer.items) == {"b"})
        assert informer.resource_version == str(api.rv)
        assert informer.lists == 1


async def test_bookmarks_advance_the_version_so_a_compaction_needs_no_relist(api: FakeApiServer, kube: KubeApi) -> None:
    async with running(kube, PODS) as informer:
        await api.wait_watching("pods")
        for i in range(3):  # changes the watcher never sees: other labels
            api.create("pods", pod(f"other-{i}", labels={"app": "other"}))
        api.send_bookmarks()
        await eventually(lambda: informer.resource_version == str(api.rv), what="bookmark applied")
        api.compact()
        api.cut_watches()
        api.create("pods", pod("a"))
        await eventually(lambda: set(informer.items) == {"a"})
        assert informer.lists == 1  # re-watched from the bookmark's version: no 410, no relist


async def test_without_bookmarks_a_compaction_forces_a_relist_that_converges(api: FakeApiServer, kube: KubeApi) -> None:
    api.create("pods", pod("a"))
    async with running(kube, PODS) as informer:
        await api.wait_watching("pods")
        api.create("pods", pod("other", labels={"app": "other"}))
        api.compact()
        api.cut_watches()
        api.delete("pods", "a")
        api.create("pods", pod("b"))
        await eventually(lambda: set(informer.items) == {"b"} and informer.lists == 2)


async def test_expired_watch_relists(api: FakeApiServer, kube: KubeApi) -> None:
    async with running(kube, PODS) as informer:
        await api.wait_watching("pods")
        api.expire_watches()
        await eventually(lambda: informer.lists == 2)


async def test_absent_resource_is_rechecked_until_installed(api: FakeApiServer, kube: KubeApi) -> None:
    api.set_installed("inferenceobjectives", False)
    async with running(kube, OBJECTIVES) as informer:
        await eventually(lambda: informer.synced and informer.absent)
        api.set_installed("inferenceobjectives", True)
        api.create("inferenceobjectives", objective("o", 1))
        await eventually(lambda: not informer.absent and set(informer.items) == {"o"})
        api.set_installed("inferenceobjectives", False)
        await eventually(lambda: informer.absent and not informer.items)


async def test_list_failures_are_retried_with_backoff(api: FakeApiServer, kube: KubeApi) -> None:
    api.create("pods", pod("a"))
    api.fail_next("list", "pods", 500, times=3)
    async with running(kube, PODS) as informer:
        await eventually(lambda: informer.synced)
        assert api.count("list", "pods") == 4
        assert set(informer.items) == {"a"}


async def test_watch_failures_re_watch_from_the_last_version(api: FakeApiServer, kube: KubeApi) -> None:
    api.fail_next("watch", "pods", 500, times=2)
    async with running(kube, PODS) as informer:
        await api.wait_watching("pods")
        api.create("pods", pod("a"))
        await eventually(lambda: set(informer.items) == {"a"})
    assert api.count("watch", "pods") == 3
    assert informer.lists == 1


async def test_periodic_resync_relists(api: FakeApiServer, kube: KubeApi) -> None:
    timing = InformerTiming(resync_s=0.2, watch_timeout_s=5, backoff_initial_s=0.02, backoff_max_s=0.1)
    async with running(kube, PODS, timing) as informer:
        await eventually(lambda: informer.lists >= 3)


def test_backoff_is_exponential_capped_and_jittered() -> None:
    timing = InformerTiming(backoff_initial_s=1.0, backoff_max_s=8.0)
    rng = random.Random(1)
    for failures, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 8.0), (1000, 8.0)]:
        delays = [backoff_delay(failures, timing, rng) for _ in range(200)]
        assert all(cap / 2 <= d < cap for d in delays)
        assert max(delays) - min(delays) > cap / 4  # jittered, not a constant


async def test_api_client_factory_shape() -> None:
    # connect() yields a real kubernetes-asyncio ApiClient, which is what run(api_client_factory=...) expects.
    async with FakeApiServer() as api, connect(api_server=api.url + "/") as client:
        assert isinstance(client, kclient.ApiClient)
        assert client.configuration.host == api.url


def test_default_backoff_cap_lets_a_change_made_during_an_api_outage_show_within_5_s() -> None:
    # docs/reliability.md, "API server down 60 s": with client-go's 30 s cap the pod deleted during the outage
    # still got requests 6 s after the API was back. A retry is drawn in [cap/2, cap): 4 s keeps it under 5 s.
    from picker.discovery.kubesettings import KubeSettings

    assert InformerTiming().backoff_max_s == KubeSettings().backoff_max_s == 4.0
    rng = random.Random(0)
    assert max(backoff_delay(n, InformerTiming(), rng) for n in range(1, 50) for _ in range(20)) < 4.0
