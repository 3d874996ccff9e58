"""Leader election against the stand-in API server: the real client code, Lease reads and conditional writes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from picker.discovery import rbac
from picker.discovery.informer import InformerTiming
from picker.discovery.kubeapi import KubeApi, connect
from picker.discovery.kubesettings import KubeSettings
from picker.discovery.leaderelection import (
    ElectionTiming,
    LeaderElector,
    LeaderRecord,
    default_identity,
    elector_for,
    lease_name,
)
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import eventually

pytestmark = pytest.mark.timeout(30)

LEASE = lease_name("default", "pool")
LEASES = "leases.coordination.k8s.io"
# Whole seconds: leaseDurationSeconds is an integer in the Lease.
FAST = ElectionTiming(lease_duration_s=2.0, renew_deadline_s=1.0, retry_period_s=0.1)
WATCH = InformerTiming(resync_s=30, watch_timeout_s=5, backoff_initial_s=0.02, backoff_max_s=0.1)


@dataclass
class Candidate:
    elector: LeaderElector
    task: asyncio.Task[None]
    changes: list[tuple[float, bool]] = field(default_factory=list)  # (monotonic time, leading)

    @property
    def leading(self) -> bool:
        return self.elector.leading


class Field:
    """Electors of one Lease; checks on every leadership change that two never lead at once."""

    def __init__(self, api: FakeApiServer) -> None:
        self.api = api
        self.candidates: list[Candidate] = []
        self.overlaps = 0

    def leaders(self) -> list[str]:
        return [c.elector.identity for c in self.candidates if c.leading]

    def lease(self) -> LeaderRecord:
        return LeaderRecord.of(self.api.get("leases", LEASE))

    @contextlib.asynccontextmanager
    async def candidate(self, identity: str, **options: object) -> AsyncIterator[Candidate]:
        changes: list[tuple[float, bool]] = []

        def on_change(leading: bool) -> None:
            changes.append((time.monotonic(), leading))
            if len(self.leaders()) > 1:
                self.overlaps += 1

        elector = LeaderElector(
            namespace="default",
            name=LEASE,
            identity=identity,
            timing=FAST,
            on_change=on_change,
            watch_timing=WATCH,
            **options,  # type: ignore[arg-type]
        )
        async with connect(api_server=self.api.url) as client:
            task = asyncio.create_task(elector.run(KubeApi(client, request_timeout_s=5)))
            candidate = Candidate(elector, task, changes)
            self.candidates.append(candidate)
            try:
                yield candidate
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


@pytest.fixture
async def api() -> AsyncIterator[FakeApiServer]:
    async with FakeApiServer() as server:
        yield server


async def attempts(api: FakeApiServer, n: int) -> None:
    """Let the candidates make ``n`` more Lease reads/writes."""
    start = len(api.responses)
    await eventually(lambda: len(api.responses) >= start + n, what=f"{n} lease requests")


def test_lease_name_and_identity() -> None:
    assert lease_name("llm", "llama") == "epp-llm-llama.gateway-api-inference-extension.sigs.k8s.io"
    assert default_identity({"POD_NAME": "llama-epp-7d9f-abcde"}) == "llama-epp-7d9f-abcde"
    one, two = default_identity({}), default_identity({})
    assert one != two  # a random suffix without POD_NAME: two processes on one host never share an identity
    assert one.partition("_")[2]


def test_elector_for_settings() -> None:
    settings = KubeSettings(pool_name="llama", pool_namespace="llm", leader_election=True, identity="pod-0")
    elector = elector_for(settings)
    assert (elector.namespace, elector.name, elector.identity) == ("llm", lease_name("llm", "llama"), "pod-0")
    assert elector.timing == ElectionTiming(15.0, 10.0, 2.0)  # controller-runtime's defaults


def test_timings_are_checked() -> None:
    with pytest.raises(ValueError, match="lease duration > renew deadline"):
        LeaderElector(namespace="d", name="l", identity="a", timing=ElectionTiming(10.0, 10.0, 2.0))


async def test_one_leads_the_other_takes_over_at_once_on_release(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")
        lease = field_.lease()
        assert (lease.holder, lease.lease_duration_s, lease.transitions) == ("a", 2, 0)
        assert lease.acquire_time is not None
        async with field_.candidate("b") as b:
            await attempts(api, 10)
            assert field_.leaders() == ["a"]
            assert field_.lease().renew_time != lease.renew_time  # a renews
            assert field_.lease().acquire_time == lease.acquire_time

            await a.elector.resign()
            released = field_.lease()
            assert not a.leading
            assert (released.holder, released.lease_duration_s) in {("", 1), ("b", 2)}  # b may already hold it
            await eventually(lambda: b.leading, what="b takes over")
            assert (field_.lease().holder, field_.lease().transitions) == ("b", 1)
            # a resigned for good: it no longer campaigns while b leads.
            await attempts(api, 5)
            assert field_.leaders() == ["b"]
    assert field_.overlaps == 0
    assert [leading for _, leading in a.changes] == [True, False]


async def test_a_dead_leader_is_replaced_only_after_its_lease_expires(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a", release_on_cancel=False) as a:
        await eventually(lambda: a.leading, what="a leads")
        async with field_.candidate("b") as b:
            await attempts(api, 5)
            a.task.cancel()  # "dies": no release
            with contextlib.suppress(asyncio.CancelledError):
                await a.task
            died_at = time.monotonic()
            assert field_.lease().holder == "a"  # still held: nobody cleared it
            assert not b.leading
            await eventually(lambda: b.leading, what="b takes over the expired lease")
            took_over_at = b.changes[-1][0]
            # b judged expiry on its own clock from when it last saw the record change (a's last renewal, at most
            # one retry period before a died): it cannot have taken over earlier than that.
            assert took_over_at - died_at >= FAST.lease_duration_s - 2 * FAST.retry_period_s
            assert field_.lease().transitions == 1
    assert field_.overlaps == 0


async def test_racing_candidates_exactly_one_leads(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a"), field_.candidate("b"), field_.candidate("c"):
        await eventually(lambda: bool(field_.leaders()), what="a leader")
        await attempts(api, 20)
        (leader,) = field_.leaders()
        assert field_.lease().holder == leader
    assert field_.overlaps == 0
    assert field_.lease().holder == ""  # each was cancelled in turn; whoever held the Lease released it


async def test_create_conflict_means_someone_else_got_there_first(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")
        # b's first read is told "no lease" (as if it raced a's create): its create must then fail with 409.
        api.fail_next("get", "leases", 404)
        async with field_.candidate("b", watch_lease=False) as b:
            await eventually(lambda: ("create", LEASES, 409) in api.responses, what="a create conflict")
            await attempts(api, 10)
            assert not b.leading
            assert field_.leaders() == ["a"]
    assert field_.overlaps == 0


async def test_update_conflict_is_reread_and_the_leader_keeps_the_lease(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")
        # Another writer touches the Lease (not its holder): a's next renewal carries a stale resourceVersion.
        api.patch("leases", LEASE, lambda lease: lease["metadata"].setdefault("labels", {}).update(touched="yes"))
        before = field_.lease().renew_time
        await eventually(lambda: ("update", LEASES, 409) in api.responses, what="an update conflict")
        await eventually(lambda: field_.lease().renew_time != before, what="a renews after re-reading")
        assert a.leading
        assert [leading for _, leading in a.changes] == [True]  # never stepped down
        assert api.get("leases", LEASE)["metadata"]["labels"] == {"touched": "yes"}  # the other write is kept


async def test_a_leader_whose_copy_is_stale_still_releases_on_cancel(api: FakeApiServer) -> None:
    # As when a renewal lands but its answer is cancelled on the wire: the Lease is newer than the leader's copy.
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")
        api.patch("leases", LEASE, lambda lease: lease["metadata"].setdefault("labels", {}).update(touched="yes"))
        a.task.cancel()  # before its next renewal could re-read
        with contextlib.suppress(asyncio.CancelledError):
            await a.task
    assert ("update", LEASES, 409) in api.responses
    assert field_.lease().holder == ""
    assert api.get("leases", LEASE)["metadata"]["labels"] == {"touched": "yes"}


async def test_another_holder_makes_the_leader_step_down_at_once(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")

        def intrude(lease: dict[str, object]) -> None:
            spec = lease["spec"]
            assert isinstance(spec, dict)
            spec.update(holderIdentity="intruder", leaseTransitions=spec["leaseTransitions"] + 1)

        api.patch("leases", LEASE, intrude)
        await eventually(lambda: not a.leading, what="a steps down")
        assert field_.lease().holder == "intruder"
        # The intruder never renews: once its lease expires on a's clock, a takes it back.
        await eventually(lambda: a.leading, what="a leads again")
        assert field_.lease().transitions == 2
        assert [leading for _, leading in a.changes] == [True, False, True]


async def test_no_renewal_within_the_deadline_steps_down(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")
        acquired = field_.lease().acquire_time
        api.fail_next("update", "leases", 500, times=1000)
        api.fail_next("get", "leases", 500, times=1000)
        await eventually(lambda: not a.leading, what="a steps down after the renew deadline")
        assert field_.lease().holder == "a"  # nothing was written
        api._failures.clear()  # the API server recovers
        await eventually(lambda: a.leading, what="a leads again")
        # Still the holder of record: it renews its own lease (same acquireTime, no transition).
        assert (field_.lease().acquire_time, field_.lease().transitions) == (acquired, 0)


async def test_a_standby_that_resigns_stops_campaigning(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")
        async with field_.candidate("b", watch_lease=False) as b:
            await attempts(api, 3)
            await b.elector.resign()
            calls = api.count("get", "leases")
            await attempts(api, 10)  # a's renewals (fast path: updates only)
            assert api.count("get", "leases") == calls
            assert field_.leaders() == ["a"]
            assert field_.lease().holder == "a"


async def test_events_and_rbac(api: FakeApiServer) -> None:
    field_ = Field(api)
    async with field_.candidate("a") as a:
        await eventually(lambda: a.leading, what="a leads")
        await a.elector.resign()
    messages = [(e["reason"], e["message"]) for e in api._objects[api.resource("events")].values()]
    assert sorted(messages) == [("LeaderElection", "a became leader"), ("LeaderElection", "a stopped leading")]
    (event, *_) = api._objects[api.resource("events")].values()
    assert event["involvedObject"]["kind"] == "Lease"
    assert event["involvedObject"]["name"] == LEASE
    # Every call is one the declared Role grants.
    granted = {r.resource: set(r.verbs) for r in rbac.LEADER_ELECTION_RULES}
    assert api.verbs("leases") == {"get", "create", "update", "list", "watch"}
    assert api.verbs("leases") <= granted["leases"]
    assert api.verbs("events") == {"create"}
    assert api.verbs("events") <= granted["events"]
