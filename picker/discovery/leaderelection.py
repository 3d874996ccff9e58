"""Leader election on a ``coordination.k8s.io/v1`` Lease, interoperable with the reference EPP's.

The reference EPP (controller-runtime, client-go's ``LeaseLock``) holds the Lease
``epp-<namespace>-<pool>.gateway-api-inference-extension.sigs.k8s.io`` in the pool namespace with lease duration
15 s, renew deadline 10 s, retry period 2 s, and releases it when it stops (``ReleaseOnCancel``). picker keeps the
same Lease, fields and rules, so a picker and a reference EPP (or two pickers of different versions) never both lead:

- **Record**: ``spec.holderIdentity``, ``leaseDurationSeconds``, ``acquireTime`` / ``renewTime`` (MicroTime,
  ``2006-01-02T15:04:05.000000Z``) and ``leaseTransitions``, +1 whenever the holder changes.
- **Expiry is judged on the local clock**: a candidate notes *when it saw* the record change and treats the lease as
  held until ``lease duration`` after that, whatever the timestamps in it say (no trust in other nodes' clocks).
- **Acquire** (a standby, every retry period with client-go's jitter, ``[1, 2.2) x`` the period): GET the Lease;
  absent ⇒ create it; held by someone else and not expired ⇒ wait; else PUT ourselves as holder with the
  resourceVersion just read. Every write is conditional on that resourceVersion, so of two candidates racing only
  one wins; the other gets 409 (``ResourceConflict``), re-reads and sees the winner.
- **Renew** (the leader, every retry period): PUT a new renewTime on the Lease last read or written (no GET); on a
  409 or any error re-read and retry. Not renewed for the renew deadline ⇒ step down; another holder seen ⇒ step
  down at once. Stepping down does not end the process (the reference restarts its pod): picker keeps campaigning
  as a standby, its discovery warm.
- **Release** (``resign()``, or cancellation while leading): PUT an empty holder with ``leaseDurationSeconds: 1``,
  so a standby may take over at once instead of waiting out the lease.
- **Hearing a release at once** (an addition): a standby also watches its Lease (list/watch, by name) and tries
  to acquire as soon as the holder is cleared or the Lease deleted, rather than up to 4.4 s later at its next poll.
- **Events**: "<identity> became leader" / "stopped leading" (reason ``LeaderElection``) on the Lease, best effort.

The API calls are exactly those ``rbac.LEADER_ELECTION_RULES`` grants: leases get/list/watch/create/update, events
create. ``on_change(leading)`` is called on the event loop whenever leadership is gained or lost; health serves on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from picker.discovery.informer import Informer, InformerTiming
from picker.discovery.kubeapi import (
    ApiClientFactory,
    KubeApi,
    KubeApiError,
    Resource,
    ResourceConflict,
    ResourceNotFound,
    connect,
)
from picker.discovery.kubesettings import KubeSettings

__all__ = [
    "ElectionTiming",
    "LeaderElector",
    "LeaderRecord",
    "campaign",
    "default_identity",
    "elector_for",
    "lease_name",
]

log = logging.getLogger(__name__)

LEASE_GROUP, LEASE_VERSION = "coordination.k8s.io", "v1"
_JITTER_FACTOR = 1.2  # client-go's wait.JitterUntil factor for acquire attempts
_EVENT_REASON = "LeaderElection"
_COMPONENT = "picker"


def lease_name(namespace: str, pool_name: str) -> str:
    """The reference EPP's Lease name for a pool: one leader per EPP deployment of that pool."""
    return f"epp-{namespace}-{pool_name}.gateway-api-inference-extension.sigs.k8s.io"


def default_identity(environ: Mapping[str, str] | None = None) -> str:
    """``$POD_NAME`` (unique among the replicas, stable across container restarts), else ``<hostname>_<uuid>``."""
    env = os.environ if environ is None else environ
    return env.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class ElectionTiming:
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


def _micro_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """The leader-election fields of a Lease spec."""

    holder: str = ""
    lease_duration_s: int = 0
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def of(cls, lease: Mapping[str, Any]) -> LeaderRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration_s=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def spec(self, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A Lease spec with this record, keeping any other fields of ``base`` (e.g. ``strategy``)."""
        spec = dict(base or {})
        spec.update(
            holderIdentity=self.holder,
            leaseDurationSeconds=self.lease_duration_s,
            acquireTime=self.acquire_time,
            renewTime=self.renew_time,
            leaseTransitions=self.transitions,
        )
        return spec


class LeaderElector:
    """Campaigns for one Lease until resigned or cancelled. See the module docstring for the rules."""

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: ElectionTiming | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        rng: random.Random | None = None,
        release_on_cancel: bool = True,
        watch_lease: bool = True,
        watch_timing: InformerTiming | None = None,
        record_events: bool = True,
    ) -> None:
        timing = timing or ElectionTiming()
        if not timing.lease_duration_s > timing.renew_deadline_s > _JITTER_FACTOR * timing.retry_period_s > 0:
            raise ValueError("need lease duration > renew deadline > 1.2 x retry period > 0")
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self._on_change = on_change
        self._clock = clock
        self._wall = wall
        self._rng = rng or random.Random()
        self._release_on_cancel = release_on_cancel
        self._watch_timing = (watch_timing or InformerTiming()) if watch_lease else None
        self._record_events = record_events
        self._leases = Resource(LEASE_GROUP, LEASE_VERSION, "leases", namespace)
        self._events = Resource("", "v1", "events", namespace)
        self._lease: dict[str, Any] | None = None  # as last read or written
        self._observed = LeaderRecord()
        self._observed_at = -float("inf")  # local clock when the record last changed
        self._leading = False
        self._renewed_at = -float("inf")
        self._wake = asyncio.Event()
        self._resigned = False
        self._campaigning = False
        self._stepped_down = asyncio.Event()
        self.transitions_seen: list[bool] = []  # every leadership change, in order (tests, logs)

    # --- state -----------------------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self._leading

    @property
    def observed(self) -> LeaderRecord:
        """The Lease record as last read or written."""
        return self._observed

    def _holds(self) -> bool:
        return self._observed.holder == self.identity

    def _valid(self) -> bool:
        return self._observed_at + self._observed.lease_duration_s > self._clock()

    def _observe(self, lease: dict[str, Any]) -> None:
        self._lease = lease
        record = LeaderRecord.of(lease)
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()

    def _set_leading(self, leading: bool, *, lost: bool = False) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        self.transitions_seen.append(leading)
        where = {"lease": self.name, "identity": self.identity}
        if leading:
            log.info("leader election: became leader", extra=where)
        elif lost:
            log.warning("leader election: lost the lease; standing by", extra=where)
        else:
            log.info("leader election: stopped leading", extra=where)
        if self._on_change is not None:
            self._on_change(leading)

    # --- the loop --------------------------------------------------------------------------------------------

    async def run(self, api: KubeApi) -> None:
        """Campaign until ``resign()`` (then stay down until cancelled) or cancellation; release when leading."""
        self._stepped_down.clear()
        self._campaigning = True
        try:
            async with asyncio.TaskGroup() as tg:
                watcher = tg.create_task(self._watch_lease(api), name="lease-watch") if self._watch_timing else None
                try:
                    await self._campaign(api)
                finally:
                    if watcher is not None:
                        watcher.cancel()
        finally:
            self._campaigning = False
            await self._step_down(api)
        await asyncio.Event().wait()  # resigned: a background task that returned would be restarted

    async def resign(self, timeout_s: float = 5.0) -> None:
        """Stop campaigning for good; when leading, release the Lease (so a standby takes over at once)."""
        self._resigned = True
        self._wake.set()
        if self._campaigning:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._stepped_down.wait()
        self._set_leading(False)

    async def _campaign(self, api: KubeApi) -> None:
        while not self._resigned:
            self._wake.clear()  # a wake-up from here on (a release heard, resign) cuts the wait below short
            acquired = await self._try_acquire_or_renew(api)
            if self._resigned:
                break
            now = self._clock()
            if acquired:
                self._renewed_at = now
                if not self._leading:
                    self._set_leading(True)
                    await self._event(api, f"{self.identity} became leader")
            elif self._leading and (not self._holds() or now - self._renewed_at >= self.timing.renew_deadline_s):
                # Another holder (someone judged our lease expired), or no renewal within the deadline: the
                # lease may be taken by now. Either way we must not act as leader any more.
                self._set_leading(False, lost=True)
                await self._event(api, f"{self.identity} stopped leading")
            period = self.timing.retry_period_s
            delay = period if self._leading else period * (1.0 + _JITTER_FACTOR * self._rng.random())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def _try_acquire_or_renew(self, api: KubeApi) -> bool:
        now = _micro_time(self._wall())
        duration_s = int(self.timing.lease_duration_s)
        # Fast path: the leader renews the Lease it last wrote, without reading it first.
        if self._leading and self._lease is not None and self._holds() and self._valid():
            old = self._observed
            renewed = LeaderRecord(self.identity, duration_s, old.acquire_time, now, old.transitions)
            try:
                self._observe(await api.replace(self._leases, self._with(self._lease, renewed)))
                return True
            except KubeApiError as exc:  # 409 included: someone wrote in between; read it and decide
                log.info("leader election: renewing %s failed (%s); re-reading", self.name, exc)
        try:
            lease = await api.get(self._leases, self.name)
        except ResourceNotFound:
            record = LeaderRecord(self.identity, duration_s, now, now, 0)
            try:
                self._observe(await api.create(self._leases, self._new_lease(record)))
            except KubeApiError as exc:  # 409: another candidate created it first; the next try reads it
                log.info("leader election: creating %s failed (%s)", self.name, exc)
                return False
            return True
        except KubeApiError as exc:
            log.warning("leader election: reading %s failed: %s", self.name, exc)
            return False
        self._observe(lease)
        if self._observed.holder and self._valid() and not self._holds():
            return False  # held by someone else, not expired
        old = self._observed
        if self._holds():
            record = LeaderRecord(self.identity, duration_s, old.acquire_time, now, old.transitions)
        else:
            record = LeaderRecord(self.identity, duration_s, now, now, old.transitions + 1)
        try:
            self._observe(await api.replace(self._leases, self._with(lease, record)))
        except KubeApiError as exc:  # 409: another candidate won the race
            log.info("leader election: updating %s failed (%s)", self.name, exc)
            return False
        return True

    async def _step_down(self, api: KubeApi) -> None:
        """Release the Lease if we hold it (``ReleaseOnCancel``); leadership ends either way."""
        try:
            if self._release_on_cancel:
                try:
                    async with asyncio.timeout(self.timing.renew_deadline_s):
                        await self._release(api)
                except (KubeApiError, TimeoutError) as exc:
                    log.warning("leader election: releasing %s failed: %s", self.name, exc)
            if self._leading:
                self._set_leading(False)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.timing.retry_period_s):
                        await self._event(api, f"{self.identity} stopped leading")
        finally:
            self._set_leading(False)
            self._stepped_down.set()

    async def _release(self, api: KubeApi) -> None:
        """Write an empty holder with a 1 s duration, so a standby may take over at once.

        "Hold", not "lead": an acquire or renewal cancelled on the wire may have made us the holder without our
        hearing of it, so unless the last answer says we hold the Lease it is read again first. For the same
        reason the copy we hold may be older than the Lease: a conflict re-reads it and tries once more.
        """
        lease = self._lease if self._holds() else None
        for attempt in range(2):
            if lease is None:
                try:
                    lease = await api.get(self._leases, self.name)
                except ResourceNotFound:
                    return
                self._observe(lease)
                if not self._holds():
                    return
            now = _micro_time(self._wall())
            released = LeaderRecord("", 1, now, now, self._observed.transitions)
            try:
                self._observe(await api.replace(self._leases, self._with(lease, released)))
            except ResourceConflict:
                if attempt:
                    raise
                lease = None
                continue
            log.info("leader election: released the lease", extra={"lease": self.name})
            return

    # --- objects ---------------------------------------------------------------------------------------------

    def _new_lease(self, record: LeaderRecord) -> dict[str, Any]:
        return {
            "apiVersion": f"{LEASE_GROUP}/{LEASE_VERSION}",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.spec(),
        }

    @staticmethod
    def _with(lease: Mapping[str, Any], record: LeaderRecord) -> dict[str, Any]:
        # metadata keeps the resourceVersion we read: the write is conditional on it.
        return {**lease, "metadata": dict(lease.get("metadata") or {}), "spec": record.spec(lease.get("spec"))}

    async def _event(self, api: KubeApi, message: str) -> None:
        """Record a core/v1 Event on the Lease, as client-go's election does. Best effort."""
        if not self._record_events:
            return
        moment = self._wall()
        meta = (self._lease or {}).get("metadata") or {}
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{self.name}.{time.time_ns():x}", "namespace": self.namespace},
            "involvedObject": {
                "apiVersion": f"{LEASE_GROUP}/{LEASE_VERSION}",
                "kind": "Lease",
                "name": self.name,
                "namespace": self.namespace,
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "reason": _EVENT_REASON,
            "message": message,
            "type": "Normal",
            "source": {"component": _COMPONENT},
            "reportingComponent": _COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "count": 1,
        }
        try:
            await api.create(self._events, event)
        except KubeApiError as exc:
            log.debug("leader election: recording the event failed: %s", exc)

    # --- hearing a release -----------------------------------------------------------------------------------

    async def _watch_lease(self, api: KubeApi) -> None:
        assert self._watch_timing is not None
        by_name = f"metadata.name={self.name}"
        leases = Resource(LEASE_GROUP, LEASE_VERSION, "leases", self.namespace, field_selector=by_name)

        def on_change(informer: Informer, _: str | None) -> None:
            lease = informer.items.get(self.name)
            if not self._leading and (lease is None or not LeaderRecord.of(lease).holder):
                self._wake.set()  # released or deleted: try now

        informer = Informer(
            api, leases, on_change=on_change, timing=self._watch_timing, clock=self._clock, rng=self._rng
        )
        await informer.run()


def elector_for(settings: KubeSettings, on_change: Callable[[bool], None] | None = None) -> LeaderElector:
    """The elector of ``settings``' pool, with its timings and identity."""
    return LeaderElector(
        namespace=settings.pool_namespace,
        name=lease_name(settings.pool_namespace, settings.pool_name),
        identity=settings.identity or default_identity(),
        timing=ElectionTiming(settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s),
        on_change=on_change,
        watch_timing=InformerTiming(
            resync_s=settings.resync_s,
            watch_timeout_s=settings.watch_timeout_s,
            backoff_initial_s=settings.backoff_initial_s,
            backoff_max_s=settings.backoff_max_s,
            absent_recheck_s=settings.crd_recheck_s,
        ),
    )


async def campaign(
    elector: LeaderElector, settings: KubeSettings, api_client_factory: ApiClientFactory | None = None
) -> None:
    """Background task: connect as discovery does, then ``elector.run`` until cancelled."""
    if api_client_factory is not None:
        client = await api_client_factory()
        try:
            await elector.run(KubeApi(client, request_timeout_s=settings.request_timeout_s))
        finally:
            await client.close()
        return
    async with connect(
        api_server=settings.api_server, kubeconfig=settings.kubeconfig, in_cluster=settings.in_cluster
    ) as client:
        await elector.run(KubeApi(client, request_timeout_s=settings.request_timeout_s))
