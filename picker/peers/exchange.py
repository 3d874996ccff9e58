"""The peer exchange's state: what this replica tells each peer, and what it does with what peers tell it.

Pure (no sockets, time from the caller): the policy lab runs it between its routers in virtual time and
``picker.peers.transport`` carries its batches over gRPC. docs/ha.md has the design; in short, every
``flush`` makes one batch per peer with

* the placements this replica's prefix scorers learned since the last flush (``PrefixCacheScorer.on_learn``),
  keeping only the (server, block) pairs this peer was not sent within ``refresh_s``: a hot prefix costs one
  announcement per refresh window, a new question on a known system prompt only its new blocks;
* this replica's own in-flight totals per server (absolute): the servers whose totals changed since the last batch
  to this peer, and all of them (``full``) at least every ``heartbeat_s``, when a batch goes out even if nothing
  changed: a peer tells a quiet replica from a dead one, and a lost batch's counts are corrected within it. The
  ledger tells the exchange which servers' totals changed (``InflightTracker.listen``), so a flush between two
  full ones reads only those, not every server of the pool (a flush's cost follows the changes, not the pool).

``receive`` applies a peer's batch: its loads to the ``PeerLoads`` table (they expire after ``state_ttl_s`` of
silence), its placements to the prefix scorer of the same name, as if this replica had made them.

Between the workers of one pod the batches also carry the outcomes of the polls each worker made for the others
(``publish_scrapes``, picker.scrape.share): sent once to every peer at the next flush, handed to ``on_scrapes``
on arrival.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import xxhash

from picker.endpoints.inflight import InflightTracker
from picker.endpoints.peerload import PeerLoads
from picker.endpoints.store import EndpointStore
from picker.peers import wire
from picker.scheduling.plugins.prefix import PrefixCacheScorer
from picker.scrape.share import SharedScrape

__all__ = ["Exchange", "ExchangeSettings", "ExchangeStats", "prefix_scorers"]

log = logging.getLogger(__name__)

_SPLIT_BYTES = wire.MAX_BATCH_BYTES // 2  # placements per batch before a flush splits (strings and loads fit)
# Shared scrapes per batch of their own: each costs at most ~2 strings of 256 bytes plus its LoRA names'
# references, so 256 stay within the byte and string limits unless servers run many distinct adapters each (then
# a batch halves until it fits).
_SCRAPES_PER_BATCH = 256
_MAX_PENDING_SCRAPES = 16_384


@dataclass(frozen=True, slots=True)
class ExchangeSettings:
    flush_interval_s: float = 0.002  # how often batches go out (picker serve --peer-flush-interval)
    refresh_s: float = 10.0  # a (server, block) pair is re-announced at most this often
    state_ttl_s: float = 1.0  # a peer silent this long stops counting
    heartbeat_s: float = 0.25  # a batch at least this often, with the loads in full
    max_pending: int = 4096  # placements waiting for a flush; beyond, the oldest are dropped
    sent_memory: int = 65_536  # (server, block) pairs remembered per peer (~100 bytes each)

    def __post_init__(self) -> None:
        if min(self.flush_interval_s, self.refresh_s, self.state_ttl_s, self.heartbeat_s) <= 0:
            raise ValueError("intervals > 0")
        if self.max_pending < 1 or self.sent_memory < 1:
            raise ValueError("max_pending and sent_memory >= 1")


@dataclass(slots=True)
class ExchangeStats:
    batches_sent: int = 0
    bytes_sent: int = 0
    batches_received: int = 0
    bytes_received: int = 0
    batches_rejected: int = 0  # bad bytes (WireError)
    batches_lost: int = 0  # gaps in peers' sequence numbers
    placements_dropped: int = 0  # over max_pending between two flushes
    placements_ignored: int = 0  # unknown plugin or server, or another block size
    scrapes_sent: int = 0  # shared poll outcomes, counted once per peer
    scrapes_received: int = 0
    scrapes_dropped: int = 0  # over the pending limit between two flushes


@dataclass(slots=True)
class _Link:
    """What this replica has told one peer."""

    # (server, block) pair -> when it was last sent, oldest first; the pair as one int (the block hash xor the
    # server's own hash: a collision only re-sends or skips one block until the refresh).
    sent: dict[int, float] = field(default_factory=dict)
    loads: dict[str, tuple[int, int]] = field(default_factory=dict)
    seq: int = 0
    last_sent_s: float = float("-inf")
    last_full_s: float = float("-inf")


def prefix_scorers(plugins: Mapping[str, object]) -> dict[str, PrefixCacheScorer]:
    """The prefix scorers of a scheduler configuration (``SchedulerConfig.plugins``), by name."""
    return {name: p for name, p in plugins.items() if isinstance(p, PrefixCacheScorer)}


class Exchange:
    def __init__(
        self,
        *,
        scorers: Mapping[str, PrefixCacheScorer],
        inflight: InflightTracker,
        peer_loads: PeerLoads,
        store: EndpointStore,
        settings: ExchangeSettings | None = None,
        incarnation: int | None = None,
    ) -> None:
        self.settings = settings or ExchangeSettings()
        self.incarnation = incarnation if incarnation is not None else random.getrandbits(63) + 1
        self.stats = ExchangeStats()
        self._scorers = dict(scorers)
        self._inflight = inflight
        self._peer_loads = peer_loads
        self._store = store
        self._links: dict[str, _Link] = {}
        self._pending: list[wire.Placement] = []
        self._last_seq: dict[int, int] = {}
        self._salts: dict[str, int] = {}
        self._changed: set[str] = set()  # servers whose own totals changed since the last flush
        self._scrapes: list[SharedScrape] = []
        # Set by the wiring between a pod's workers (app/root.py): takes the peers' poll outcomes and the clock.
        self.on_scrapes: Callable[[tuple[SharedScrape, ...], float], None] | None = None
        for scorer in self._scorers.values():
            scorer.on_learn = self._learned
        inflight.listen(self._changed.add)

    def close(self) -> None:
        """Stop listening to the scorers and the ledger."""
        for scorer in self._scorers.values():
            if scorer.on_learn == self._learned:
                scorer.on_learn = None
        self._inflight.unlisten(self._changed.add)

    # -- peers ---------------------------------------------------------------------------------------------------

    @property
    def peers(self) -> list[str]:
        return list(self._links)

    def set_peers(self, names: Iterable[str]) -> None:
        """The peers to send to (any names: addresses in production, router indexes in the lab)."""
        want = set(names)
        for name in [n for n in self._links if n not in want]:
            del self._links[name]
        for name in want:
            self._links.setdefault(name, _Link())

    def reset_peer(self, name: str) -> None:
        """A link (re)connected: the peer may have restarted, so tell it everything again from now on."""
        if name in self._links:
            self._links[name] = _Link()

    # -- sending -------------------------------------------------------------------------------------------------

    def _learned(self, plugin: str, endpoint: str, block_bytes: int, hashes: Iterable[int]) -> None:
        if not self._links:
            return
        self._pending.append(wire.Placement(plugin, endpoint, block_bytes, tuple(hashes)[: wire.MAX_HASHES]))
        excess = len(self._pending) - self.settings.max_pending
        if excess > 0:
            del self._pending[:excess]
            self.stats.placements_dropped += excess

    def publish_scrapes(self, scrapes: Iterable[SharedScrape]) -> None:
        """Poll outcomes for every peer, sent at the next flush."""
        if not self._links:
            return
        self._scrapes.extend(scrapes)
        excess = len(self._scrapes) - _MAX_PENDING_SCRAPES
        if excess > 0:
            del self._scrapes[:excess]
            self.stats.scrapes_dropped += excess

    def flush(self, now: float) -> dict[str, list[bytes]]:
        """The batches to send now, per peer (usually one; more only when the placements or scrapes exceed one)."""
        pending, self._pending = self._pending, []
        scrapes, self._scrapes = self._scrapes, []
        changed = self._changed_loads()
        heartbeat = self.settings.heartbeat_s
        own = self._own_loads() if any(now - k.last_full_s >= heartbeat for k in self._links.values()) else None
        out: dict[str, list[bytes]] = {}
        for name, link in self._links.items():
            batches = self._batches_for(link, pending, scrapes, own, changed, now)
            if batches:
                out[name] = batches
        return out

    def _own_loads(self) -> dict[str, tuple[int, int]]:
        """Every server of the pool with this replica's totals (zeros left out: a full batch's absent ones)."""
        inflight = self._inflight
        loads = ((e.key, (inflight.requests(e.key), inflight.tokens(e.key))) for e in self._store.current())
        return {k: v for k, v in loads if v != (0, 0)}

    def _changed_loads(self) -> dict[str, tuple[int, int]]:
        """The totals of the servers that changed since the last flush; (0, 0) for one no longer in the pool."""
        changed = list(self._changed)
        self._changed.clear()  # the same set: the ledger holds its ``add``
        snapshot = self._store.current()
        inflight = self._inflight
        return {
            k: (inflight.requests(k), inflight.tokens(k)) if snapshot.get(k) is not None else (0, 0) for k in changed
        }

    def _batches_for(
        self,
        link: _Link,
        pending: list[wire.Placement],
        scrapes: list[SharedScrape],
        own: dict[str, tuple[int, int]] | None,
        changed: dict[str, tuple[int, int]],
        now: float,
    ) -> list[bytes]:
        settings = self.settings
        full = own is not None and now - link.last_full_s >= settings.heartbeat_s
        if full:
            assert own is not None
            loads = dict(own)
        else:
            loads = {k: v for k, v in changed.items() if link.loads.get(k, (0, 0)) != v}
        places = self._fresh(link, pending, now)
        if not places and not scrapes and not loads and not full and now - link.last_sent_s < settings.heartbeat_s:
            return []
        # The loads (and a heartbeat) ride in the first placements batch; scrapes alone need no such batch.
        chunks: list[list[wire.Placement]] = [] if scrapes and not (places or loads or full) else [[]]
        size = 0
        for p in places:
            cost = 10 + 8 * len(p.hashes)
            if chunks[-1] and (size + cost > _SPLIT_BYTES or len(chunks[-1]) >= wire.MAX_RECORDS // 2):
                chunks.append([])
                size = 0
            chunks[-1].append(p)
            size += cost
        out = []
        for i, chunk in enumerate(chunks):
            link.seq += 1
            batch = wire.Batch(self.incarnation, link.seq, full and i == 0, loads if i == 0 else {}, tuple(chunk))
            out.append(wire.encode(batch))
        for start in range(0, len(scrapes), _SCRAPES_PER_BATCH):  # in batches of their own
            out += self._scrape_batches(link, tuple(scrapes[start : start + _SCRAPES_PER_BATCH]))
        self.stats.batches_sent += len(out)
        self.stats.bytes_sent += sum(len(data) for data in out)
        if full:
            link.loads = loads
        else:
            for k, v in loads.items():
                if v == (0, 0):
                    link.loads.pop(k, None)
                else:
                    link.loads[k] = v
        link.last_sent_s = now
        if full:
            link.last_full_s = now
        return out

    def _scrape_batches(self, link: _Link, scrapes: tuple[SharedScrape, ...]) -> list[bytes]:
        """``scrapes`` in as many batches as the wire's limits need (halving); an outcome that fits no batch (a
        LoRA name over 256 bytes, hundreds of adapters) is dropped, and the peers, hearing nothing of that server,
        poll it themselves."""
        try:
            data = wire.encode(wire.Batch(self.incarnation, link.seq + 1, False, scrapes=scrapes))
        except wire.WireError as exc:
            if len(scrapes) == 1:
                log.debug("shared scrape of %s dropped: %s", scrapes[0].key, exc)
                self.stats.scrapes_dropped += 1
                return []
            half = len(scrapes) // 2
            return self._scrape_batches(link, scrapes[:half]) + self._scrape_batches(link, scrapes[half:])
        link.seq += 1
        self.stats.scrapes_sent += len(scrapes)
        return [data]

    def _fresh(self, link: _Link, pending: list[wire.Placement], now: float) -> list[wire.Placement]:
        """The pending placements cut to the (server, block) pairs not sent to this link within refresh_s."""
        sent = link.sent
        refresh = self.settings.refresh_s
        out = []
        for p in pending:
            key = p.endpoint
            salt = self._salts.get(key)
            if salt is None:
                salt = self._salts[key] = xxhash.xxh64_intdigest(key.encode())
                if len(self._salts) > 4096:  # servers come and go: keep the table bounded
                    self._salts.pop(next(iter(self._salts)))
            new = []
            for h in p.hashes:
                pair = h ^ salt
                at = sent.get(pair)
                if at is None or now - at >= refresh:
                    new.append(h)
                    if at is not None:
                        del sent[pair]  # re-inserted last: the dict stays oldest first
                    sent[pair] = now
            if new:
                out.append(wire.Placement(p.plugin, key, p.block_bytes, tuple(new)))
        excess = len(sent) - self.settings.sent_memory
        if excess > 0:
            for pair in list(itertools.islice(sent, excess)):
                del sent[pair]
        return out

    # -- receiving -----------------------------------------------------------------------------------------------

    def receive(self, data: bytes, now: float) -> wire.Batch | None:
        """Apply one batch from a peer. Returns it, or None when it was dropped (bad bytes, or our own)."""
        try:
            batch = wire.decode(data)
        except wire.WireError as exc:
            self.stats.batches_rejected += 1
            log.debug("peer batch rejected: %s", exc)
            return None
        if batch.incarnation == self.incarnation:
            return None
        stats = self.stats
        stats.batches_received += 1
        stats.bytes_received += len(data)
        last = self._last_seq.get(batch.incarnation)
        if last is not None and batch.seq > last + 1:
            stats.batches_lost += batch.seq - last - 1
        if last is None or batch.seq > last:
            self._last_seq[batch.incarnation] = batch.seq
        if len(self._last_seq) > 1024:  # incarnations of restarted peers: keep the table bounded
            self._last_seq.pop(next(iter(self._last_seq)))
        self._peer_loads.update(batch.incarnation, now, batch.loads, full=batch.full)
        snapshot = self._store.current()
        for p in batch.placements:
            scorer = self._scorers.get(p.plugin)
            endpoint = snapshot.get(p.endpoint)
            if scorer is None or endpoint is None or not scorer.learn_placement(endpoint, p.block_bytes, p.hashes):
                stats.placements_ignored += 1
        if batch.scrapes:
            stats.scrapes_received += len(batch.scrapes)
            if self.on_scrapes is not None:
                self.on_scrapes(batch.scrapes, now)
        return batch
