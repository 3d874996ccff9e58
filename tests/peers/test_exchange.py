"""The exchange between two replicas, in process: placements and in-flight counts, dedup, loss, restarts."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import EndpointMetrics
from picker.endpoints.peerload import PeerLoads
from picker.endpoints.store import EndpointStore
from picker.peers import wire
from picker.peers.exchange import Exchange, ExchangeSettings, prefix_scorers
from picker.scheduling.config import load_config
from picker.scheduling.framework import PluginContext
from picker.scheduling.plugins.prefix import PrefixCacheScorer
from picker.scheduling.plugins.prefix_index import prefix_hashes
from picker.scheduling.scheduler import Scheduler
from picker.scrape.share import SharedScrape
from tests.conftest import FakeClock, endpoint, request

SYSTEM = "You are a careful assistant. " * 40  # ~1100 characters: many 64-byte blocks


@dataclass
class Replica:
    ctx: PluginContext
    store: EndpointStore
    scheduler: Scheduler
    exchange: Exchange

    @property
    def scorer(self) -> PrefixCacheScorer:
        [scorer] = prefix_scorers(self.scheduler.config.plugins).values()
        return scorer

    def route(self, prompt: str, target: int) -> str:
        """Route a request, restricted to endpoint ``target`` (so the test knows where it went)."""
        eps = [e for e in self.store.current().candidates() if e.key == f"192.168.1.{target}:8000"]
        req = request(prompt=prompt)
        result = self.scheduler.schedule(req, eps)
        self.ctx.inflight.acquire(result.targets[0].key, req.prompt_tokens, self.ctx.clock())
        self.scheduler.pre_request(req, result)
        return result.targets[0].key

    def matched(self, prompt: str) -> dict[str, int]:
        req = request(prompt=prompt)
        return self.scorer.index.match(hashes(self.scorer, req.prompt_text))


def hashes(scorer: PrefixCacheScorer, prompt: str) -> tuple[int, ...]:
    return prefix_hashes(prompt, scorer.block_chars(endpoint(1)), 256, "my-model")


def replica(clock: FakeClock, incarnation: int, settings: ExchangeSettings | None = None) -> Replica:
    settings = settings or ExchangeSettings(refresh_s=2.0, heartbeat_s=0.25, state_ttl_s=1.0)
    store = EndpointStore()
    store.set_endpoints([endpoint(i) for i in (1, 2, 3)])
    peers = PeerLoads(settings.state_ttl_s)
    ctx = PluginContext(clock=clock, inflight=InflightTracker(), peers=peers)
    scheduler = Scheduler(load_config(None, ctx), ctx)
    exchange = Exchange(
        scorers=prefix_scorers(scheduler.config.plugins), inflight=ctx.inflight, peer_loads=peers, store=store,
        settings=settings, incarnation=incarnation,
    )  # fmt: skip
    return Replica(ctx, store, scheduler, exchange)


def pair(clock: FakeClock) -> tuple[Replica, Replica]:
    a, b = replica(clock, 1), replica(clock, 2)
    a.exchange.set_peers(["b"])
    b.exchange.set_peers(["a"])
    return a, b


def deliver(src: Replica, dst: Replica, name: str, now: float) -> list[wire.Batch]:
    out = []
    for data in src.exchange.flush(now).get(name, []):
        batch = dst.exchange.receive(data, now)
        assert batch is not None
        out.append(batch)
    return out


def test_a_placement_reaches_the_peer_index(clock: FakeClock) -> None:
    a, b = pair(clock)
    prompt = SYSTEM + "question one"
    assert b.matched(prompt) == {}
    a.route(prompt, 2)
    deliver(a, b, "b", clock())
    assert b.matched(prompt) == {"192.168.1.2:8000": len(hashes(b.scorer, prompt))}
    # and b's scheduler now prefers endpoint 2 for the same prefix among all candidates
    result = b.scheduler.schedule(request(prompt=SYSTEM + "question two"), b.store.current().candidates())
    assert result.targets[0].key == "192.168.1.2:8000"


def test_only_new_blocks_are_sent_until_the_refresh(clock: FakeClock) -> None:
    a, b = pair(clock)
    a.route(SYSTEM + "question one", 2)
    [first] = deliver(a, b, "b", clock())
    sent = sum(len(p.hashes) for p in first.placements)
    clock.advance(0.01)
    a.route(SYSTEM + "question two, a different one", 2)
    [second] = deliver(a, b, "b", clock())
    resent = sum(len(p.hashes) for p in second.placements)
    assert 0 < resent <= 2 < sent  # the question's new tail, not the system prompt
    clock.advance(2.0)  # past refresh_s: the hot prefix is announced again in full
    a.route(SYSTEM + "question one", 2)
    [third] = deliver(a, b, "b", clock())
    assert sum(len(p.hashes) for p in third.placements) == sent


def test_in_flight_counts_reach_the_peer_and_expire(clock: FakeClock) -> None:
    a, b = pair(clock)
    a.route(SYSTEM + "q", 3)
    a.route(SYSTEM + "r", 3)
    deliver(a, b, "b", clock())
    ep3 = b.store.current().get("192.168.1.3:8000")
    assert ep3 is not None
    assert b.ctx.ledger_requests(ep3.key) == 2
    assert b.ctx.server_load(ep3).requests == 2  # no fresh scrape beyond: the pool's ledger
    assert b.ctx.ledger_tokens([ep3])[0] == a.ctx.inflight.tokens(ep3.key) > 0
    clock.advance(1.0)  # a is silent for state_ttl_s: its counts no longer count
    assert b.ctx.ledger_requests(ep3.key) == 0


def test_a_lost_batch_is_healed_by_the_next_full_snapshot(clock: FakeClock) -> None:
    a, b = pair(clock)
    deliver(a, b, "b", clock())  # first batch: full, nothing in flight
    clock.advance(0.01)
    a.route(SYSTEM + "q", 1)
    assert a.exchange.flush(clock())  # lost on the way
    clock.advance(0.01)
    assert a.exchange.flush(clock()) == {}  # nothing changed since the lost one: nothing to send yet
    assert b.ctx.ledger_requests("192.168.1.1:8000") == 0
    clock.advance(0.25)  # the heartbeat carries the loads in full
    [batch] = deliver(a, b, "b", clock())
    assert batch.full
    assert b.ctx.ledger_requests("192.168.1.1:8000") == 1
    assert b.exchange.stats.batches_lost == 1  # the gap in sequence numbers is seen


def test_between_full_snapshots_a_batch_names_the_servers_whose_totals_changed(clock: FakeClock) -> None:
    a, b = pair(clock)
    deliver(a, b, "b", clock())  # full
    clock.advance(0.01)
    a.route(SYSTEM + "q", 1)
    lease = a.ctx.inflight.acquire("192.168.1.2:8000", 50, clock())
    a.ctx.inflight.release(lease)  # changed, and back where it was: nothing to tell
    [batch] = deliver(a, b, "b", clock())
    assert not batch.full
    assert set(batch.loads) == {"192.168.1.1:8000"}
    clock.advance(0.01)
    a.ctx.inflight.observe("192.168.1.3:8000", ttft_s=0.1)  # no change of the totals
    assert a.exchange.flush(clock()) == {}
    a.store.set_endpoints([endpoint(2), endpoint(3)])  # server 1 leaves the pool with a request of a's on it
    a.ctx.inflight.forget_except(["192.168.1.2:8000", "192.168.1.3:8000"])
    [batch] = deliver(a, b, "b", clock())
    assert batch.loads == {"192.168.1.1:8000": (0, 0)}
    assert b.ctx.ledger_requests("192.168.1.1:8000") == 0
    a.exchange.close()
    a.route(SYSTEM + "r", 2)
    clock.advance(0.01)
    assert a.exchange.flush(clock()) == {}  # closed: no longer told of changes


def test_quiet_links_send_heartbeats_only(clock: FakeClock) -> None:
    a, b = pair(clock)
    assert len(deliver(a, b, "b", clock())) == 1  # first: full snapshot
    clock.advance(0.1)
    assert a.exchange.flush(clock()) == {}
    clock.advance(0.2)
    [beat] = deliver(a, b, "b", clock())
    assert beat.placements == ()
    assert beat.full
    assert len(wire.encode(beat)) < 40 + 3 * (2 + 16 + 10)  # header, then 3 servers' zero loads


def test_a_restarted_peer_is_told_everything_again(clock: FakeClock) -> None:
    a, b = pair(clock)
    a.route(SYSTEM + "q", 2)
    deliver(a, b, "b", clock())
    fresh_b = replica(clock, 3)
    fresh_b.exchange.set_peers(["a"])
    a.exchange.reset_peer("b")  # the transport reconnected
    clock.advance(0.01)
    a.route(SYSTEM + "q", 2)
    deliver(a, fresh_b, "b", clock())
    assert fresh_b.matched(SYSTEM + "q") == {"192.168.1.2:8000": len(SYSTEM + "q") // 64 + 1}


def test_own_batches_bad_bytes_and_other_block_sizes_are_dropped(clock: FakeClock) -> None:
    a, b = pair(clock)
    a.route(SYSTEM + "q", 2)
    data = a.exchange.flush(clock())["b"][0]
    assert a.exchange.receive(data, clock()) is None  # its own incarnation
    assert b.exchange.receive(b"garbage", clock()) is None
    assert b.exchange.stats.batches_rejected == 1
    batch = wire.decode(data)
    cut = tuple(wire.Placement(p.plugin, p.endpoint, 32, p.hashes) for p in batch.placements)
    other = wire.Batch(9, 1, False, {}, cut)
    assert b.exchange.receive(wire.encode(other), clock()) is not None
    assert b.exchange.stats.placements_ignored == 1
    assert b.matched(SYSTEM + "q") == {}


def test_pending_placements_are_bounded(clock: FakeClock) -> None:
    a = replica(clock, 1, ExchangeSettings(max_pending=3))
    a.exchange.set_peers(["b"])
    for i in range(5):
        a.route(f"{SYSTEM} {i}", 1)
    assert a.exchange.stats.placements_dropped == 2
    a.exchange.close()
    a.route(SYSTEM + "after close", 1)
    assert a.exchange.stats.placements_dropped == 2


def test_the_memory_of_what_was_sent_is_bounded(clock: FakeClock) -> None:
    a = replica(clock, 1, ExchangeSettings(sent_memory=50))
    a.exchange.set_peers(["b"])
    for i in range(5):
        a.route(f"{i} {SYSTEM}", 1)  # different first block: every block new
        a.exchange.flush(clock())
    assert len(a.exchange._links["b"].sent) == 50
    # what fell out of the memory is sent again at its next use, before the refresh window ends
    a.route(f"0 {SYSTEM}", 1)
    [data] = a.exchange.flush(clock())["b"]
    assert sum(len(p.hashes) for p in wire.decode(data).placements) > 0


def test_shared_scrapes_go_once_to_every_peer_and_reach_the_receiver(clock: FakeClock) -> None:
    a, b = pair(clock)
    c = replica(clock, 3)
    a.exchange.set_peers(["b", "c"])
    got: list[tuple[tuple[SharedScrape, ...], float]] = []
    b.exchange.on_scrapes = lambda scrapes, now: got.append((scrapes, now))
    outcomes = [
        SharedScrape("192.168.1.1:8000", 0.01, EndpointMetrics(waiting=4, running=2, kv_usage=0.5)),
        SharedScrape("192.168.1.2:8000", 0.0, None, "refused", "ConnectionRefusedError"),
    ]
    a.exchange.flush(clock())  # the first batches to new peers: the loads in full
    clock.advance(0.001)  # not a heartbeat yet: the scrapes alone make the batch
    a.exchange.publish_scrapes(outcomes)
    [to_b] = deliver(a, b, "b", clock())
    assert got == [(tuple(outcomes), clock())]
    assert to_b.scrapes == tuple(outcomes)
    assert a.exchange.stats.scrapes_sent == 4  # two outcomes, two peers
    assert b.exchange.stats.scrapes_received == 2
    assert c.exchange.on_scrapes is None  # a receiver not wired for scrapes counts them and drops them
    clock.advance(0.001)
    assert a.exchange.flush(clock()) == {}  # sent once


def test_many_shared_scrapes_are_split_over_batches_within_the_limits(clock: FakeClock) -> None:
    a, b = pair(clock)
    got: list[SharedScrape] = []
    b.exchange.on_scrapes = lambda scrapes, now: got.extend(scrapes)
    loras = frozenset(f"adapter-{i:03d}-" + "x" * 50 for i in range(40))  # many distinct strings per scrape
    outcomes = [
        SharedScrape(f"10.{i // 250}.{i % 250}.1:8000", 0.0, EndpointMetrics(running_loras=loras)) for i in range(600)
    ]
    outcomes += [SharedScrape(f"10.9.{i}.1:8000", 0.0, None, "http", "m" * 300) for i in range(200)]
    a.exchange.publish_scrapes(outcomes)
    batches = deliver(a, b, "b", clock())
    assert len(batches) > 1
    assert sum(len(batch.loads) for batch in batches[1:]) == 0  # the loads travel in the first batch only
    assert [s.key for s in got] == [s.key for s in outcomes]
    assert got[0].metrics == outcomes[0].metrics


def test_scrapes_are_not_queued_without_peers_and_are_bounded(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = replica(clock, 1)
    a.exchange.publish_scrapes([SharedScrape("k", 0.0, EndpointMetrics())])
    a.exchange.set_peers(["b"])
    [heartbeat] = a.exchange.flush(clock())["b"]  # the first batch to a new peer: loads in full, no scrapes
    assert wire.decode(heartbeat).scrapes == ()
    monkeypatch.setattr("picker.peers.exchange._MAX_PENDING_SCRAPES", 2)
    a.exchange.publish_scrapes([SharedScrape(str(i), 0.0, EndpointMetrics()) for i in range(5)])
    assert a.exchange.stats.scrapes_dropped == 3
    [data] = a.exchange.flush(clock())["b"]
    assert [s.key for s in wire.decode(data).scrapes] == ["3", "4"]


def test_an_outcome_over_the_wire_limits_is_dropped_alone(clock: FakeClock) -> None:
    """The peers hear nothing of that server then, and poll it themselves (picker.scrape.share's takeover)."""
    a, b = pair(clock)
    got: list[SharedScrape] = []
    b.exchange.on_scrapes = lambda scrapes, now: got.extend(scrapes)
    a.route(SYSTEM + "q", 2)
    huge = EndpointMetrics(running_loras=frozenset({"x" * (wire.MAX_STRING_BYTES + 1)}))
    fine = SharedScrape("192.168.1.3:8000", 0.0, EndpointMetrics(waiting=2))
    a.exchange.publish_scrapes([SharedScrape("192.168.1.1:8000", 0.0, huge), fine])
    batches = deliver(a, b, "b", clock())
    assert any(batch.placements for batch in batches)  # the rest arrived
    assert got == [fine]
    assert (a.exchange.stats.scrapes_dropped, a.exchange.stats.scrapes_sent) == (1, 1)


def test_scrapes_whose_strings_overflow_one_batch_are_split_until_they_fit(clock: FakeClock) -> None:
    a, b = pair(clock)
    got: list[SharedScrape] = []
    b.exchange.on_scrapes = lambda scrapes, now: got.extend(scrapes)
    # 256 servers with 40 adapters of their own each: 10,240 distinct strings, over a batch's 4,096
    outcomes = [
        SharedScrape(f"10.0.{i}.1:8000", 0.0, EndpointMetrics(running_loras=frozenset(f"s{i}-a{j}" for j in range(40))))
        for i in range(256)
    ]
    a.exchange.publish_scrapes(outcomes)
    batches = deliver(a, b, "b", clock())
    assert len(batches) >= 3
    assert [batch.seq for batch in batches] == list(range(batches[0].seq, batches[0].seq + len(batches)))  # no gaps
    assert got == outcomes
    assert (a.exchange.stats.scrapes_sent, a.exchange.stats.scrapes_dropped) == (256, 0)
    assert b.exchange.stats.batches_lost == 0
