"""The server's last report corrected by picker's own sends since (endpoints.serverload)."""

from __future__ import annotations

import random

import pytest

from picker.endpoints import serverload
from picker.endpoints.inflight import EndpointLoad, InflightTracker
from picker.endpoints.model import Endpoint
from picker.endpoints.serverload import ServerLoad, estimate
from tests.conftest import endpoint

NOW = 1000.0


def _sent(ep: Endpoint, requests: int, tokens: int = 100) -> InflightTracker:
    """picker's ledger after sending ``requests`` of ``tokens`` each to ``ep``, none finished."""
    inflight = InflightTracker()
    for _ in range(requests):
        inflight.acquire(ep.key, tokens, NOW)
    return inflight


def test_only_picker_sends_traffic_the_estimate_is_the_ledger() -> None:
    # At the sample the server had 3 requests, all picker's; since, picker sent 2 more and saw 1 finish.
    ep = endpoint(1, waiting=0, running=3, own_requests=3, updated_at=NOW - 0.05)
    inflight = _sent(ep, 4)
    load = estimate(ep, inflight.load(ep.key), NOW)
    assert load.fresh
    assert load.foreign_requests == 0.0
    assert load.requests == 4
    assert load.tokens(1000.0, 50.0) == 400


def test_traffic_picker_did_not_send_counts_at_the_weight_of_its_own_requests() -> None:
    # 10 waiting + 6 running reported, of which 2 were picker's (still in flight): 14 foreign, split 10:6 like the
    # report.
    ep = endpoint(1, waiting=10, running=6, own_requests=2, updated_at=NOW - 0.05)
    inflight = InflightTracker()
    inflight.acquire(ep.key, 100, NOW)
    inflight.acquire(ep.key, 200, NOW)
    load = estimate(ep, inflight.load(ep.key), NOW)
    assert load.foreign_requests == pytest.approx(14.0)
    assert load.foreign_waiting == pytest.approx(14.0 * 10 / 16)
    assert load.foreign_running == pytest.approx(14.0 * 6 / 16)
    assert load.requests == pytest.approx(16.0)  # picker's 2 + 14 foreign
    assert load.tokens(1000.0, 50.0) == pytest.approx(300 + 8.75 * 1000 + 5.25 * 50)


def test_a_restarted_picker_sees_the_queues_it_did_not_fill() -> None:
    ep = endpoint(1, waiting=4, running=20, own_requests=0)
    load = estimate(ep, InflightTracker().load(ep.key), NOW)
    assert (load.own_requests, load.foreign_requests) == (0, 24.0)


def test_requests_in_transit_never_make_the_foreign_load_negative() -> None:
    # picker had sent 5 that the server had not counted yet (in transit): no foreign load, and the ledger stands.
    ep = endpoint(1, waiting=0, running=2, own_requests=5)
    inflight = _sent(ep, 5, tokens=10)
    load = estimate(ep, inflight.load(ep.key), NOW)
    assert load == ServerLoad(5, 50, 0.0, 0.0, 0.0, fresh=True)


def test_without_a_noted_ledger_the_current_ledger_stands_in() -> None:
    ep = endpoint(1, waiting=1, running=4, own_requests=None)
    inflight = InflightTracker()
    inflight.acquire(ep.key, 10, NOW)
    inflight.acquire(ep.key, 10, NOW)
    assert estimate(ep, inflight.load(ep.key), NOW).foreign_requests == pytest.approx(3.0)


@pytest.mark.parametrize("age", [2.5, 60.0])
def test_stale_or_missing_samples_leave_the_ledger_alone(age: float) -> None:
    ep = endpoint(1, waiting=50, running=50, own_requests=0, kv=0.9, updated_at=NOW - age)
    load = estimate(ep, InflightTracker().load(ep.key), NOW, max_age_s=2.0)
    assert not load.fresh
    assert (load.foreign_requests, load.kv_usage) == (0.0, 0.0)
    never = endpoint(2, waiting=50, updated_at=0.0)
    assert not estimate(never, InflightTracker().load(never.key), NOW).fresh


def test_the_columnar_loops_equal_estimate_on_random_pools() -> None:
    rng = random.Random(11)
    now = 1000.0
    moved = 0
    for _ in range(300):
        eps = [
            endpoint(
                i,
                waiting=rng.randrange(0, 9),
                running=rng.randrange(0, 9),
                kv=rng.random(),
                updated_at=rng.choice([0.0, now - 5.0, now - 2.0, now - 0.5, now]),
                own_requests=rng.choice([None, 0, 1, 3]),
            )
            for i in range(1, rng.randrange(1, 12))
        ]
        loads = {e.key: EndpointLoad(requests=rng.randrange(0, 6), tokens=rng.randrange(0, 5000)) for e in eps[::2]}

        def load(key: str, loads: dict[str, EndpointLoad] = loads) -> EndpointLoad:
            return loads.get(key) or EndpointLoad()

        per_request, per_decode = rng.uniform(1, 3000), rng.uniform(1, 500)
        expected = [estimate(e, load(e.key), now) for e in eps]
        assert serverload.requests_of(eps, load, now) == [x.requests for x in expected]
        assert serverload.tokens_of(eps, load, now, per_request, per_decode) == [
            x.tokens(per_request, per_decode) for x in expected
        ]
        assert serverload.foreign_of(eps, load, now) == [x.foreign_requests for x in expected]
        reported = [estimate(e, load(e.key), now, follow_own=False) for e in eps]
        assert serverload.waiting_of(eps, load, now) == [x.foreign_waiting for x in reported]
        moved += expected != reported
    assert moved > 50  # the pools exercise the move with picker's own, not only servers it leaves alone


def test_the_other_routers_are_assumed_to_send_where_picker_sent_since_the_report() -> None:
    # Four routers alike: the server reported 8, 2 of them this picker's (m = 4). Since, picker sent 2 more: the 3
    # others, reading the same report, likely did too, 6 more before the next report shows them.
    ep = endpoint(1, waiting=4, running=4, own_requests=2, updated_at=NOW - 0.05)
    inflight = _sent(ep, 4)
    load = estimate(ep, inflight.load(ep.key), NOW)
    assert load.foreign_requests == 6 + 6.0
    assert load.foreign_waiting == 3 + 6.0  # the others' new requests wait, as whole ones
    assert load.requests == 4 + 12.0
    assert load.tokens(1000.0, 50.0) == 400 + 9 * 1000.0 + 3 * 50.0
    assert serverload.waiting_of([ep], inflight.load, NOW) == [3.0]  # the waiting count alone: as reported
    unmoved = estimate(ep, inflight.load(ep.key), NOW, follow_own=False)
    assert (unmoved.foreign_requests, unmoved.foreign_waiting) == (6, 3.0)


def test_requests_picker_saw_finish_since_the_report_take_the_others_alike_with_them() -> None:
    ep = endpoint(1, waiting=4, running=4, own_requests=2, updated_at=NOW - 0.05)
    inflight = InflightTracker()
    leases = [inflight.acquire(ep.key, 100, NOW) for _ in range(2)]
    inflight.release(leases[0])  # one of picker's finished: the others' 6 are 3 fewer, from waiting and running
    load = estimate(ep, inflight.load(ep.key), NOW)
    assert (load.foreign_requests, load.foreign_waiting) == (3.0, 1.5)
    inflight.release(leases[1])  # more finished than the others had: none left, never below
    assert estimate(ep, inflight.load(ep.key), NOW).foreign_requests == 0.0


def test_where_picker_sends_a_small_share_its_own_sends_count_at_most_eight_times() -> None:
    # Just restarted: 1 of the 40 requests the server reported is picker's. Its own sends say little of the rest.
    ep = endpoint(1, waiting=20, running=20, own_requests=1)
    inflight = InflightTracker()
    inflight.acquire(ep.key, 10, NOW)
    inflight.acquire(ep.key, 10, NOW)
    assert estimate(ep, inflight.load(ep.key), NOW).foreign_requests == 39 + (serverload.MAX_OTHERS_PER_OWN - 1)


def test_a_server_picker_had_nothing_on_at_the_report_is_not_moved() -> None:
    # A client that sends straight to one server does not follow picker: nothing of picker's there to scale by,
    # and picker's sends elsewhere are its own only.
    hot = endpoint(1, waiting=30, running=10, own_requests=0)
    mine = endpoint(2, waiting=0, running=4, own_requests=4)
    inflight = InflightTracker()
    inflight.acquire(hot.key, 10, NOW)
    for _ in range(6):
        inflight.acquire(mine.key, 10, NOW)
    assert serverload.foreign_of([hot, mine], inflight.load, NOW) == [40.0, 0.0]
    assert serverload.requests_of([hot, mine], inflight.load, NOW) == [41.0, 6.0]
