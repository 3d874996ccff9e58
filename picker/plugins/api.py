"""The plugin protocols and what a plugin may read: the request, the candidates, picker's own counts.

A scheduling cycle hands every plugin the same read-only values:

* ``InferenceRequest`` (``picker.request.model``): the parsed request — ``model`` / ``target_model``, ``api``
  (an ``ApiKind``), ``prompt_text``, ``prompt_tokens`` (an estimate), ``max_tokens``, ``stream``, ``headers``
  (lower-cased keys), ``objective``, ``priority``. Frozen.
* ``Endpoint`` (``picker.endpoints.model``): one candidate — ``key`` (``ip:port``), ``address``, ``port``,
  ``name``, ``labels``, ``engine`` and ``metrics`` (an ``EndpointMetrics``: ``waiting``, ``running``,
  ``kv_usage`` in [0, 1], LoRA adapters, ``updated_at``). Frozen; equality and hashing use ``key`` only.
* ``PluginContext``: a clock, a seeded random source, and two read-only views computed on demand:
  ``ctx.load(endpoint)`` (picker's own in-flight requests and tokens there, and the TTFT / TPOT it observed),
  ``ctx.server_load(endpoint)`` (the server's last report corrected by what picker sent it since: its load
  now, traffic picker did not route included, and assumed to have followed picker's own sends since the report;
  ``picker.endpoints.serverload``) and ``ctx.metrics_age_s(endpoint)`` (seconds since that endpoint's metrics
  were scraped).
* ``CycleState``: a dict shared by the plugins of one cycle, for work computed once and reused.

The three role protocols are structural: a class needs only the method. The engine gives each configured
plugin its identity (the config's ``type`` and ``name``); the built-in plugins implement the same protocols.

Score contract: a scorer returns, for the endpoints it was given, a ``Mapping[Endpoint, float]`` (an endpoint
missing from it scores 0) or a sequence of floats aligned with them. Each score is clamped to [0, 1] (NaN ⇒ 0),
multiplied by the profile's weight for that scorer and summed per endpoint; the picker chooses on the sums.
"""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

from picker.endpoints import serverload
from picker.endpoints.inflight import EndpointLoad, InflightTracker
from picker.endpoints.model import Endpoint
from picker.endpoints.peerload import PeerLoads
from picker.endpoints.serverload import ServerLoad
from picker.request.model import InferenceRequest

__all__ = [
    "ROTATE_TIES",
    "UNCACHED_TOKENS",
    "Category",
    "CycleState",
    "Filter",
    "LoadView",
    "Picker",
    "PluginContext",
    "ProfileResult",
    "ScoredEndpoint",
    "Scorer",
    "Scores",
    "ServerLoad",
]

Scores: TypeAlias = Mapping[Endpoint, float] | Sequence[float]
"""A scorer's result: per endpoint (missing ⇒ 0), or a sequence aligned with the endpoints it was given."""


class Category(enum.Enum):
    """What a scorer favours (the reference's categories; informational)."""

    AFFINITY = "Affinity"  # where state already is: cached prefixes, loaded adapters, a tenant's label
    DISTRIBUTION = "Distribution"  # spreading load: queues, KV use, in-flight work
    BALANCE = "Balance"  # a mix of both


class CycleState(dict[str, Any]):
    """Per-cycle scratch space shared by the plugins of one scheduling cycle (e.g. prefix match results).

    Key entries by your plugin's type and name to avoid clashes; nothing in it outlives the cycle.
    """


# A cycle-state flag a scorer sets (``cycle[ROTATE_TIES] = True``) when its scores leave servers tied by design:
# it counted what decides this request's wait, and nothing differed. ``max-score-picker`` then breaks that
# request's ties by a rotation (kept over the flagged requests only), not at random, so such requests are spaced
# evenly. Pickers that do not rank by score ignore it.
ROTATE_TIES = "picker.rotate-ties"

# A cycle-state entry a scorer that knows each candidate's prefix cache sets: endpoint key -> the prompt tokens
# that server would still have to compute for this request. The director keeps the chosen one's on the in-flight
# lease (``Lease.prefill_tokens``), so later estimates count what is left to prefill there, not the whole prompt.
UNCACHED_TOKENS = "picker.uncached-tokens"


class LoadView(Protocol):
    """picker's own, exact count of what it has sent an endpoint and not yet seen finish (read-only)."""

    @property
    def requests(self) -> int: ...

    @property
    def tokens(self) -> int:
        """Prompt tokens not yet prefilled plus expected output tokens."""
        ...

    @property
    def ttft_s(self) -> float | None:
        """Moving average of the time to first token picker observed there; None until one is observed."""
        ...

    @property
    def tpot_s(self) -> float | None:
        """Moving average of the time per output token picker observed there; None until one is observed."""
        ...


_NO_LOAD = EndpointLoad()  # an endpoint nobody has work on; never mutated


@dataclass(frozen=True, slots=True)
class PluginContext:
    """What a plugin may use besides its inputs: a clock, picker's own in-flight counts, a random source."""

    clock: Callable[[], float]  # monotonic seconds (virtual time in the policy lab)
    inflight: InflightTracker  # picker's; read it through ``load`` — its other methods are picker's to call
    # The random source of pickers and tie-breaks; tests pass a seeded one.
    rng: random.Random = field(default_factory=random.Random)
    # Scraped samples older than this are not the server's present (--metrics-staleness-threshold).
    metrics_max_age_s: float = serverload.DEFAULT_MAX_AGE_S
    # What the other picker replicas have in flight (docs/ha.md); None: no peer exchange.
    peers: PeerLoads | None = None

    def __post_init__(self) -> None:
        if self.peers is not None:
            self.peers.attach(self.inflight)  # the pool's table (``ledger_loads``) follows picker's ledger

    def load(self, endpoint: Endpoint) -> LoadView:
        """picker's in-flight requests and tokens on ``endpoint``, and the TTFT / TPOT it observed there."""
        return self.inflight.load(endpoint.key)

    def server_load(self, endpoint: Endpoint) -> ServerLoad:
        """``endpoint``'s load now: its last scraped report corrected by picker's sends and completions since,
        so it counts traffic picker did not route (other replicas, direct clients) without a scrape's lag. With a
        peer exchange, the other replicas' in-flight counts are added to picker's own (the pool's ledger)."""
        own = self.inflight.load(endpoint.key)
        now = self.clock()
        peers = self.peers
        if peers is not None:
            key = endpoint.key
            n, t = peers.requests(key, now), peers.tokens(key, now)
            if n or t:
                own = EndpointLoad(own.requests + n, own.tokens + t, own.ttft_s, own.tpot_s)
        return serverload.estimate(endpoint, own, now, self.metrics_max_age_s)

    def ledger_tokens(self, endpoints: Sequence[Endpoint]) -> list[int]:
        """In-flight tokens on each endpoint, in order: picker's own, plus its peers' (with a peer exchange)."""
        if self.peers is None:
            return self.inflight.tokens_of(endpoints)
        pooled = self.peers.pooled(self.clock())
        return [load.tokens if (load := pooled.get(e.key)) is not None else 0 for e in endpoints]

    def ledger_requests(self, key: str) -> int:
        """In-flight requests on one endpoint: picker's own plus its peers' (what the poller notes at a scrape)."""
        if self.peers is None:
            return self.inflight.requests(key)
        load = self.peers.pooled(self.clock()).get(key)
        return load.requests if load is not None else 0

    def ledger_loads(self) -> Mapping[str, EndpointLoad]:
        """Endpoint key → in-flight load, picker's own plus its peers' (with a peer exchange), for every endpoint
        with any; absent keys have none. Read only (kept up to date at each change: ``PeerLoads.pooled``)."""
        if self.peers is None:
            return self.inflight.loads()
        return self.peers.pooled(self.clock())

    def _ledger_get(self) -> Callable[[str], EndpointLoad]:
        if self.peers is None:
            return self.inflight.load
        pooled = self.peers.pooled(self.clock())
        return lambda key: pooled.get(key) or _NO_LOAD

    def server_requests(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """``server_load(e).requests`` for each endpoint, in order (a scorer's loop, without an object each)."""
        return serverload.requests_of(endpoints, self._ledger_get(), self.clock(), self.metrics_max_age_s)

    def server_waiting(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """For each endpoint, in order: the requests each server reported waiting beyond picker's own (and its
        peers') in flight at its sample, not moved with picker's sends since (``serverload.waiting_of``; the other
        counts and ``server_load`` are)."""
        return serverload.waiting_of(endpoints, self._ledger_get(), self.clock(), self.metrics_max_age_s)

    def server_foreign(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """``server_load(e).foreign_requests`` for each endpoint, in order: the requests each server reported beyond
        picker's own (and its peers') in flight."""
        return serverload.foreign_of(endpoints, self._ledger_get(), self.clock(), self.metrics_max_age_s)

    def server_tokens(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """``server_load(e).tokens(request_tokens, decode_tokens)`` for each endpoint, in order, foreign requests
        weighed at picker's averages (``InflightTracker.request_tokens`` / ``decode_tokens``)."""
        inflight = self.inflight
        return serverload.tokens_of(
            endpoints,
            self._ledger_get(),
            self.clock(),
            inflight.request_tokens,
            inflight.decode_tokens,
            self.metrics_max_age_s,
        )

    def metrics_age_s(self, endpoint: Endpoint) -> float:
        """Seconds since ``endpoint``'s metrics were last scraped successfully; ``math.inf`` if never."""
        updated_at = endpoint.metrics.updated_at
        return self.clock() - updated_at if updated_at > 0.0 else math.inf


@dataclass(frozen=True, slots=True)
class ScoredEndpoint:
    endpoint: Endpoint
    score: float  # weighted sum over the profile's scorers


@dataclass(frozen=True, slots=True)
class ProfileResult:
    targets: tuple[Endpoint, ...]  # primary first, then fallbacks


@runtime_checkable
class Scorer(Protocol):
    """Scores each candidate in [0, 1]; higher is better. A class may also set ``category`` (a ``Category``)."""

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores: ...


@runtime_checkable
class Filter(Protocol):
    """Keeps a subset of the candidates (in order). Keeping none fails the profile."""

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]: ...


@runtime_checkable
class Picker(Protocol):
    """Chooses the destination (primary first, then fallbacks) from the weighted sums."""

    def pick(self, scored: Sequence[ScoredEndpoint], cycle: CycleState) -> ProfileResult: ...
