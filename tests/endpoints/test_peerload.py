"""PeerLoads: absolute reports per peer, full snapshots replace, silence expires a peer."""

from __future__ import annotations

import pytest

from picker.endpoints.peerload import PeerLoads
from tests.conftest import endpoint


def test_reports_sum_over_peers_and_partial_reports_update() -> None:
    loads = PeerLoads(ttl_s=1.0)
    loads.update(1, 10.0, {"a": (2, 200), "b": (1, 50)}, full=True)
    loads.update(2, 10.0, {"a": (3, 300)}, full=True)
    assert loads.requests("a", 10.1) == 5
    assert loads.tokens("a", 10.1) == 500
    loads.update(1, 10.2, {"a": (0, 0)}, full=False)  # peer 1 finished its requests on a; b untouched
    assert (loads.requests("a", 10.3), loads.requests("b", 10.3)) == (3, 1)


def test_full_report_zeroes_what_it_does_not_name() -> None:
    loads = PeerLoads(ttl_s=1.0)
    loads.update(1, 10.0, {"a": (2, 200), "b": (1, 50)}, full=True)
    loads.update(1, 10.5, {"a": (1, 100)}, full=True)
    assert loads.requests("b", 10.6) == 0
    assert loads.tokens_of([endpoint(1), endpoint(2)], 10.6) == [0, 0]


def test_silent_peer_expires_and_a_report_revives_it() -> None:
    loads = PeerLoads(ttl_s=1.0)
    loads.update(1, 10.0, {"a": (2, 200)}, full=True)
    loads.update(2, 10.6, {"a": (1, 10)}, full=True)
    assert loads.requests("a", 10.99) == 3
    assert loads.requests("a", 11.0) == 1  # peer 1 silent for ttl
    assert loads.peers(11.0) == [2]
    assert loads.requests("a", 11.6) == 0
    loads.update(1, 12.0, {"a": (4, 40)}, full=False)
    assert loads.requests("a", 12.0) == 4


def test_forget_and_bad_ttl() -> None:
    loads = PeerLoads()
    loads.update(7, 1.0, {"a": (1, 1)}, full=True)
    loads.forget(7)
    assert loads.requests("a", 1.0) == 0
    with pytest.raises(ValueError, match="ttl_s"):
        PeerLoads(ttl_s=0)


def test_sums_match_a_recount_after_random_reports() -> None:
    import random

    rng = random.Random(1)
    loads = PeerLoads(ttl_s=0.5)
    now = 0.0
    truth: dict[int, tuple[float, dict[str, tuple[int, int]]]] = {}
    for _ in range(3000):
        now += rng.random() * 0.05
        peer = rng.randrange(5)
        rows = {f"k{rng.randrange(6)}": (rng.randrange(3), rng.randrange(3) * 100) for _ in range(rng.randrange(4))}
        full = rng.random() < 0.2
        loads.update(peer, now, rows, full=full)
        seen, old = truth.get(peer, (now, {}))
        if now - seen >= 0.5:
            old = {}
        merged = {} if full else dict(old)
        merged.update(rows)
        truth[peer] = (now, {k: v for k, v in merged.items() if v != (0, 0)})
        for key in (f"k{i}" for i in range(6)):
            live = [r for at, rs in truth.values() if now - at < 0.5 for k, r in rs.items() if k == key]
            assert loads.requests(key, now) == sum(r[0] for r in live)
            assert loads.tokens(key, now) == sum(r[1] for r in live)


def test_the_pooled_table_equals_a_fresh_merge_after_random_changes_on_both_sides() -> None:
    """``pooled`` is kept up to date at each change; it must equal merging the ledger and the peers' sums anew."""
    import random

    from picker.endpoints.inflight import InflightTracker, Lease

    rng = random.Random(7)
    own = InflightTracker()
    loads = PeerLoads(ttl_s=0.5)
    own.acquire("k0", 100, 0.0)  # entries from before attaching are pooled too
    loads.update(9, 0.0, {"k1": (1, 10)}, full=True)
    loads.attach(own)
    loads.attach(own)  # the same tracker again: no-op
    leases: list[Lease] = []
    now = 0.0
    keys = [f"k{i}" for i in range(5)]
    for _ in range(4000):
        now += rng.random() * 0.02
        action = rng.random()
        if action < 0.3:
            leases.append(own.acquire(rng.choice(keys), rng.randrange(1, 900), now))
        elif action < 0.5 and leases:
            own.release(leases.pop(rng.randrange(len(leases))))
        elif action < 0.6 and leases:
            own.prefilled(rng.choice(leases), rng.randrange(500))
        elif action < 0.65:
            own.observe(rng.choice(keys), ttft_s=rng.random())
        elif action < 0.67:
            own.forget_except(rng.sample(keys, 3))
        elif action < 0.95:
            rows = {rng.choice(keys): (rng.randrange(3), rng.randrange(3) * 100) for _ in range(rng.randrange(3))}
            loads.update(rng.randrange(3), now, rows, full=rng.random() < 0.2)
        else:
            loads.forget(rng.randrange(3))
        pooled = loads.pooled(now)
        requests, tokens = loads.totals(now)
        expected = {}
        for key in own.loads().keys() | requests.keys():
            mine = own.load(key)
            expected[key] = (mine.requests + requests.get(key, 0), mine.tokens + tokens.get(key, 0), mine.ttft_s)
        assert {k: (v.requests, v.tokens, v.ttft_s) for k, v in pooled.items()} == expected


def test_a_peer_table_follows_one_tracker() -> None:
    from picker.endpoints.inflight import InflightTracker

    loads = PeerLoads()
    loads.attach(InflightTracker())
    with pytest.raises(ValueError, match="one InflightTracker"):
        loads.attach(InflightTracker())
