"""What the other picker replicas have in flight on each endpoint, as they last told us (docs/ha.md).

Each peer (one replica incarnation) reports its own ledger's totals per endpoint: requests and tokens in flight,
as absolute values, so a lost report is corrected by the next one. A report marked ``full`` replaces everything
that peer said before (endpoints it does not name are at zero); otherwise it updates the endpoints it names. A peer
that has not reported for ``ttl_s`` (dead, restarted under a new id, partitioned away) no longer counts: the load
estimate then falls back to what the servers' scrapes say beyond this replica's own ledger.

Reads (``requests``, ``tokens_of``) are on the scheduling hot path: the sums over peers are kept per endpoint and
adjusted by the rows a report changes (or a silent peer's rows when it expires), never recomputed. So is the pool's
table (``attach`` an ``InflightTracker``, then ``pooled``): this replica's own loads plus the peers' sums, one
entry per endpoint, brought up to date at each change on either side rather than merged at each read. A scheduling
cycle reads it two or three times; merging 16 endpoints per read was a quarter of the cycle with peers present.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from picker.endpoints.inflight import EndpointLoad, HasKey, InflightTracker

__all__ = ["PeerLoads", "PeerRow"]

PeerRow = tuple[int, int]  # (requests, tokens) one peer has in flight on one endpoint


@dataclass(slots=True)
class _Peer:
    seen_at: float
    rows: dict[str, PeerRow] = field(default_factory=dict)


class PeerLoads:
    """Per-endpoint sums of the in-flight totals fresh peers reported."""

    def __init__(self, ttl_s: float = 1.0) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s > 0")
        self.ttl_s = ttl_s
        self._peers: dict[int, _Peer] = {}
        self._requests: dict[str, int] = {}
        self._tokens: dict[str, int] = {}
        self._next_expiry = float("inf")
        self._own: InflightTracker | None = None
        self._pooled: dict[str, EndpointLoad] = {}

    def attach(self, own: InflightTracker) -> None:
        """Keep ``pooled`` for this replica's ledger ``own`` (once; attaching the same tracker again is a no-op)."""
        if self._own is own:
            return
        if self._own is not None:
            raise ValueError("a PeerLoads follows one InflightTracker")
        self._own = own
        own.listen(self._refresh)
        for key in own.loads().keys() | self._requests.keys():
            self._refresh(key)

    def pooled(self, now: float) -> Mapping[str, EndpointLoad]:
        """Endpoint key → the attached ledger's load plus the fresh peers' (requests, tokens; TTFT and TPOT are
        the ledger's), for every endpoint with any; absent keys have none. Read only: an endpoint no peer has work
        on maps to the ledger's own entry."""
        self._expire(now)
        return self._pooled

    def update(self, peer: int, now: float, rows: Mapping[str, PeerRow], *, full: bool) -> None:
        """A report from ``peer`` (its incarnation id) at ``now``."""
        self._expire(now)
        entry = self._peers.get(peer)
        if entry is None:
            entry = self._peers[peer] = _Peer(now)
        entry.seen_at = max(entry.seen_at, now)
        if full:
            for key, row in entry.rows.items():
                self._add(key, row, -1)
            entry.rows = {k: v for k, v in rows.items() if v != (0, 0)}
            for key, row in entry.rows.items():
                self._add(key, row, 1)
        else:
            for key, row in rows.items():
                old = entry.rows.pop(key, None)
                if old is not None:
                    self._add(key, old, -1)
                if row != (0, 0):
                    entry.rows[key] = row
                    self._add(key, row, 1)
        self._next_expiry = min(self._next_expiry, entry.seen_at + self.ttl_s)

    def forget(self, peer: int) -> None:
        entry = self._peers.pop(peer, None)
        if entry is not None:
            for key, row in entry.rows.items():
                self._add(key, row, -1)

    def peers(self, now: float) -> list[int]:
        """The peers whose reports still count."""
        self._expire(now)
        return list(self._peers)

    def requests(self, key: str, now: float) -> int:
        self._expire(now)
        return self._requests.get(key, 0)

    def tokens(self, key: str, now: float) -> int:
        self._expire(now)
        return self._tokens.get(key, 0)

    def totals(self, now: float) -> tuple[Mapping[str, int], Mapping[str, int]]:
        """(requests, tokens) per endpoint key, only the endpoints some fresh peer has work on. Read only."""
        self._expire(now)
        return self._requests, self._tokens

    def tokens_of(self, endpoints: Iterable[HasKey], now: float) -> list[int]:
        self._expire(now)
        get = self._tokens.get
        return [get(e.key, 0) for e in endpoints]

    def _expire(self, now: float) -> None:
        if now < self._next_expiry:
            return
        for peer in [p for p, e in self._peers.items() if now - e.seen_at >= self.ttl_s]:
            self.forget(peer)
        self._next_expiry = min((e.seen_at + self.ttl_s for e in self._peers.values()), default=float("inf"))

    def _add(self, key: str, row: PeerRow, sign: int) -> None:
        n = self._requests.get(key, 0) + sign * row[0]
        t = self._tokens.get(key, 0) + sign * row[1]
        if n or t:
            self._requests[key], self._tokens[key] = n, t
        else:
            self._requests.pop(key, None)
            self._tokens.pop(key, None)
        if self._own is not None:
            self._refresh(key)

    def _refresh(self, key: str) -> None:
        """Bring the pool's entry for ``key`` up to date (after a change on either side)."""
        assert self._own is not None
        own = self._own.loads().get(key)
        n = self._requests.get(key, 0)
        t = self._tokens.get(key, 0)
        if not n and not t:
            if own is None:
                self._pooled.pop(key, None)
            else:
                self._pooled[key] = own  # the ledger's live entry: its changes need no copy
        elif own is None:
            self._pooled[key] = EndpointLoad(n, t)
        else:
            self._pooled[key] = EndpointLoad(own.requests + n, own.tokens + t, own.ttft_s, own.tpot_s)
