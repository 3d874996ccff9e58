"""Kubernetes discovery: InferencePool + pods → endpoints; InferenceObjective + InferenceModelRewrite → policy.

Pool mode (``--pool-name``): one informer watches the InferencePool by name in the pool namespace; when its
selector or target ports change (or it first appears) the pod informer is restarted with the new label selector,
i.e. the pods are re-listed. Each ready pod x active target port is an endpoint (``kubeobjects.endpoints_for``).
The pool deleted (or unreadable) ⇒ no endpoints and not synced. Four more informers follow InferenceObjective and
InferenceModelRewrite, in both their groups (``inference.networking.x-k8s.io`` and ``llm-d.ai``, where upstream
moved them), when their CRDs exist (a 404 ⇒ absent, logged once and re-checked every ``crd_recheck_s``) and
publish the objects whose ``spec.poolRef`` names our pool as a ``PoolPolicy``.

Standalone mode (``--endpoint-selector k=v,… --endpoint-target-ports 8000,8001``): no CRDs at all; the pods
matching the selector x the given ports.

Endpoints reach ``EndpointStore.set_endpoints(eps, synced=True)`` only once the pool (if any) and a full pod list
have been read; the store's ``synced`` flag stays False until then (and while the pool's appProtocol is not one
picker supports), so health reports NOT_SERVING. Every pod event re-derives the endpoint set at once (deletion,
readiness, IP change); an unchanged set is not re-published. The list/watch/backoff/resync machinery is
``informer.Informer``; the collections watched are those ``rbac.rules_for`` grants.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable

from kubernetes_asyncio import client as kclient

from picker.discovery import kubeobjects
from picker.discovery.informer import Informer, InformerTiming
from picker.discovery.kubeapi import ApiClientFactory, KubeApi, Resource, connect
from picker.discovery.kubeobjects import PoolSpec
from picker.discovery.kubesettings import KubeSettings, configure, settings_from_args
from picker.discovery.rbac import POLICY_GROUPS
from picker.endpoints.model import Endpoint
from picker.endpoints.policy import PolicyStore, PoolPolicy
from picker.endpoints.store import EndpointStore

__all__ = ["KubeDiscovery", "KubeSettings", "configure", "run", "settings_from_args"]

log = logging.getLogger(__name__)

POLICY_VERSION = "v1alpha2"
POLICY_PLURALS = ("inferenceobjectives", "inferencemodelrewrites")


def _timing(settings: KubeSettings) -> InformerTiming:
    return InformerTiming(
        resync_s=settings.resync_s,
        watch_timeout_s=settings.watch_timeout_s,
        backoff_initial_s=settings.backoff_initial_s,
        backoff_max_s=settings.backoff_max_s,
        absent_recheck_s=settings.crd_recheck_s,
    )


class KubeDiscovery:
    """The informers of one pool (or one standalone selector) and what they publish."""

    def __init__(
        self,
        api: KubeApi,
        *,
        store: EndpointStore,
        policy_store: PolicyStore,
        settings: KubeSettings,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        settings.validate()
        self._api = api
        self._store = store
        self._policy_store = policy_store
        self._settings = settings
        self._clock = clock
        self._rng = rng or random.Random()
        self._timing = _timing(settings)
        self._tg: asyncio.TaskGroup | None = None
        self._pool: PoolSpec | None = None
        self._pods: Informer | None = None
        self._pods_task: asyncio.Task[None] | None = None
        self._pod_endpoints: kubeobjects.PodEndpoints | None = None  # of the current pods informer
        self._published: tuple[tuple[Endpoint, ...], bool] | None = None
        self._synced = False
        ns = settings.pool_namespace
        self._policy_informers: tuple[Informer, ...] = ()
        self._pool_informer: Informer | None = None
        if not settings.standalone:
            pools = Resource(
                settings.pool_group,
                settings.pool_version,
                "inferencepools",
                ns,
                field_selector=f"metadata.name={settings.pool_name}",
            )
            self._pool_informer = self._informer(pools, self._on_pool)
            self._policy_informers = tuple(
                self._informer(Resource(group, POLICY_VERSION, plural, ns), self._on_policy)
                for group in POLICY_GROUPS
                for plural in POLICY_PLURALS
            )

    @property
    def synced(self) -> bool:
        """The pool (if any) and a full pod list of it have been read and their endpoints published."""
        return self._synced

    @property
    def pool(self) -> PoolSpec | None:
        """The current pool spec (the fixed selector and ports in standalone mode)."""
        return self._pool

    @property
    def serving(self) -> bool:
        """Health: synced, and the pool's appProtocol is one picker supports (the store's ``synced`` flag)."""
        return self._synced and self._pool is not None and self._pool.app_protocol_supported

    def watched(self) -> tuple[tuple[str, str], ...]:
        """(API group, resource) of every collection this discovery lists and watches (for the RBAC check)."""
        kinds = [("", "pods")]
        kinds += [(i.resource.group, i.resource.plural) for i in (self._pool_informer, *self._policy_informers) if i]
        return tuple(kinds)

    def _informer(self, resource: Resource, on_change: Callable[[Informer, str | None], None]) -> Informer:
        return Informer(self._api, resource, on_change=on_change, timing=self._timing, clock=self._clock, rng=self._rng)

    async def run(self) -> None:
        """Run the informers until cancelled."""
        async with asyncio.TaskGroup() as tg:
            self._tg = tg
            if self._settings.standalone:
                self._set_pool(PoolSpec(self._settings.endpoint_selector, self._settings.target_ports))
            else:
                assert self._pool_informer is not None
                tg.create_task(self._pool_informer.run(), name="kube-pool")
                for informer in self._policy_informers:
                    tg.create_task(informer.run(), name=f"kube-{informer.resource.plural}")
            await asyncio.Event().wait()  # the informers run until we are cancelled

    # --- pool and pods ---------------------------------------------------------------------------------------

    def _on_pool(self, informer: Informer, _: str | None) -> None:
        obj = informer.items.get(self._settings.pool_name)
        spec: PoolSpec | None = None
        if obj is not None:
            try:
                spec = kubeobjects.parse_pool(obj)
            except kubeobjects.InvalidPool as exc:
                log.error(
                    "kubernetes: InferencePool %s/%s is unusable: %s",
                    self._settings.pool_namespace,
                    self._settings.pool_name,
                    exc,
                )
        elif informer.absent:
            log.error("kubernetes: the InferencePool CRD (%s) is not installed", self._settings.pool_group)
        self._set_pool(spec)

    def _set_pool(self, spec: PoolSpec | None) -> None:
        old, self._pool = self._pool, spec
        if spec == old:
            return
        if spec is not None and not spec.app_protocol_supported:
            log.error("kubernetes: InferencePool appProtocol %r is not supported: NOT_SERVING", spec.app_protocol)
        if spec is None:
            log.info(
                "kubernetes: InferencePool %s/%s is gone; no endpoints",
                self._settings.pool_namespace,
                self._settings.pool_name,
            )
            self._stop_pods()
            self._refresh()
        elif old is None or old.selector != spec.selector or old.target_ports != spec.target_ports:
            log.info(
                "kubernetes: pool selector %s, target ports %s; listing pods",
                kubeobjects.format_selector(spec.selector),
                ",".join(map(str, spec.target_ports)),
            )
            # Until the new list completes, the endpoints published for the old spec stay.
            self._start_pods(spec)
        else:
            self._refresh()  # only appProtocol changed: same endpoints, maybe a different serving state

    def _start_pods(self, spec: PoolSpec) -> None:
        self._stop_pods()
        assert self._tg is not None
        resource = Resource(
            "", "v1", "pods", self._settings.pool_namespace, label_selector=kubeobjects.format_selector(spec.selector)
        )
        self._pod_endpoints = kubeobjects.PodEndpoints(spec.target_ports)
        self._pods = self._informer(resource, self._on_pods)
        self._pods_task = self._tg.create_task(self._pods.run(), name="kube-pods")

    def _stop_pods(self) -> None:
        if self._pods_task is not None:
            self._pods_task.cancel()
        self._pods, self._pods_task, self._pod_endpoints = None, None, None

    def _on_pods(self, informer: Informer, name: str | None) -> None:
        if informer is not self._pods or self._pod_endpoints is None:
            return  # a replaced informer's last word: ignore it
        # One pod's event costs one pod's work; a (re)list recomputes all.
        if name is None:
            self._pod_endpoints.reset(informer.items.values())
        else:
            self._pod_endpoints.update(name, informer.items.get(name))
        self._refresh()

    def _refresh(self) -> None:
        """Derive the endpoints from the pool and the pod cache; publish them if anything changed.

        The store's ``synced`` flag is what health serves on: a full pod list of the current pool has been read
        and the pool's appProtocol is supported. No pool ⇒ no endpoints and not synced.
        """
        if self._pool is None:
            self._synced = False
            self._publish((), synced=False)
            return
        if self._pods is None or self._pod_endpoints is None or not self._pods.synced:
            return
        self._synced = True
        self._publish(self._pod_endpoints.endpoints(), synced=self._pool.app_protocol_supported)

    def _publish(self, eps: tuple[Endpoint, ...], *, synced: bool) -> None:
        # PodEndpoints hands back the very same tuple while nothing changed: identity is the cheap test.
        if self._published is not None and self._published[0] is eps and self._published[1] == synced:
            return
        if self._published is None or self._published[1] != synced:
            log.info("kubernetes: %d endpoints, %s", len(eps), "synced" if synced else "not synced")
        self._published = (eps, synced)
        self._store.set_endpoints(eps, synced=synced)

    # --- objectives and rewrites -----------------------------------------------------------------------------

    def _on_policy(self, _: Informer, __: str | None) -> None:
        # Both groups' objects count; on a name in both, the llm-d.ai object (listed last) wins.
        by_plural: dict[str, list[dict[str, object]]] = {plural: [] for plural in POLICY_PLURALS}
        for informer in self._policy_informers:
            by_plural[informer.resource.plural].extend(informer.items.values())
        policy = kubeobjects.build_policy(
            by_plural["inferenceobjectives"],
            by_plural["inferencemodelrewrites"],
            pool_name=self._settings.pool_name,
            pool_group=self._settings.pool_group,
        )
        if self._policy_store.publish(policy):
            log.info(
                "kubernetes: policy: %d objectives, %d rewrite rules", len(policy.objectives), len(policy.rewrites)
            )


@contextlib.asynccontextmanager
async def _api_client(settings: KubeSettings, factory: ApiClientFactory | None) -> AsyncIterator[kclient.ApiClient]:
    if factory is None:
        async with connect(
            api_server=settings.api_server, kubeconfig=settings.kubeconfig, in_cluster=settings.in_cluster
        ) as client:
            yield client
        return
    client = await factory()
    try:
        yield client
    finally:
        await client.close()


async def run(
    *,
    store: EndpointStore,
    policy_store: PolicyStore,
    settings: KubeSettings,
    clock: Callable[[], float] = time.monotonic,
    api_client_factory: ApiClientFactory | None = None,
    rng: random.Random | None = None,
    on_start: Callable[[KubeDiscovery], None] | None = None,
) -> None:
    """Discovery task: connect, then keep ``store`` and ``policy_store`` current until cancelled.

    ``on_start`` receives the KubeDiscovery (for health: ``serving``/``synced``) before the first list.
    """
    settings.validate()
    if settings.standalone:
        policy_store.publish(PoolPolicy())
    async with _api_client(settings, api_client_factory) as client:
        discovery = KubeDiscovery(
            KubeApi(client, request_timeout_s=settings.request_timeout_s),
            store=store,
            policy_store=policy_store,
            settings=settings,
            clock=clock,
            rng=rng,
        )
        if on_start is not None:
            on_start(discovery)
        await discovery.run()
