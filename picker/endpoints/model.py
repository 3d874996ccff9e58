"""Endpoint, EndpointMetrics and EndpointSnapshot: immutable values read by a scheduling cycle.

An ``Endpoint`` is identified by its ``key`` (``ip:port``, IPv6 as ``[v6]:port``): equality and hashing use the
key only, so scores can be keyed by endpoint across snapshots.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["Endpoint", "EndpointMetrics", "EndpointSnapshot", "format_hostport"]

_EMPTY_LABELS: Mapping[str, str] = MappingProxyType({})


def format_hostport(address: str, port: int) -> str:
    """``ip:port``; an IPv6 address is bracketed as the destination header requires."""
    try:
        if ipaddress.ip_address(address).version == 6:
            return f"[{address}]:{port}"
    except ValueError:
        pass
    return f"{address}:{port}"


@dataclass(frozen=True, slots=True)
class EndpointMetrics:
    """What the model server last reported about itself (scraped)."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0  # 0..1
    running_loras: frozenset[str] = frozenset()
    waiting_loras: frozenset[str] = frozenset()
    max_loras: int = 0
    block_size: int | None = None  # tokens per KV block
    num_gpu_blocks: int | None = None
    # Counters since the server started (None: not reported): the tokens it generated, the prompt tokens it
    # looked up in its prefix cache as it admitted them and those it found there; between two reports they tell
    # how fast it works (servermodel.py)
    generated_tokens: float | None = None
    prefix_query_tokens: float | None = None
    prefix_hit_tokens: float | None = None
    updated_at: float = 0.0  # monotonic seconds of the last successful scrape; 0 = never
    # picker's own in-flight requests to this endpoint when the page was read (the poller notes it): what the
    # server reported beyond that is traffic picker did not send. None: not noted.
    own_requests: int | None = None


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One model-server endpoint (a pod's rank: IP x target port)."""

    key: str  # "ip:port" — the identity, the destination header value
    address: str = field(compare=False)
    port: int = field(compare=False)
    name: str = field(default="", compare=False)  # pod name or "<pod>-rank-<i>"; key when static
    metrics_url: str | None = field(default=None, compare=False)  # None: not scraped
    engine: str = field(default="vllm", compare=False)
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY_LABELS, compare=False)
    metrics: EndpointMetrics = field(default_factory=EndpointMetrics, compare=False)
    # Set by the freshness tracker: stale or failing scrapes take an endpoint out of the candidate set.
    excluded: bool = field(default=False, compare=False)
    # Set by the director's outlier detection: an endpoint answering only 5xx is out for a while (outliers.py).
    ejected: bool = field(default=False, compare=False)
    # Set by the director's hung-server detection: requests overdue for their first answer, none since (hung.py).
    suspect: bool = field(default=False, compare=False)

    @classmethod
    def create(
        cls,
        address: str,
        port: int,
        *,
        name: str = "",
        metrics_url: str | None = None,
        engine: str = "vllm",
        labels: Mapping[str, str] | None = None,
    ) -> Endpoint:
        key = format_hostport(address, port)
        return cls(
            key=key,
            address=address,
            port=port,
            name=name or key,
            metrics_url=metrics_url,
            engine=engine,
            labels=MappingProxyType(dict(labels)) if labels else _EMPTY_LABELS,
        )


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """All known endpoints at one moment. Published whole; never mutated."""

    endpoints: tuple[Endpoint, ...] = ()
    version: int = 0
    synced: bool = False  # discovery has completed its first sync
    _by_key: Mapping[str, Endpoint] = field(default_factory=dict, init=False, compare=False, repr=False)
    # candidates(), computed on first use: asked once per request, and a snapshot never changes
    _candidates: tuple[Endpoint, ...] | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_key", {e.key: e for e in self.endpoints})

    def __len__(self) -> int:
        return len(self.endpoints)

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(self.endpoints)

    def get(self, key: str) -> Endpoint | None:
        return self._by_key.get(key)

    def candidates(self) -> tuple[Endpoint, ...]:
        """Endpoints fit to schedule: not excluded, ejected or suspect; else the non-excluded ones; else all of them."""
        found = self._candidates
        if found is None:
            fresh = tuple(e for e in self.endpoints if not e.excluded)
            healthy = tuple(e for e in fresh if not e.ejected and not e.suspect)
            found = healthy or fresh or self.endpoints
            object.__setattr__(self, "_candidates", found)
        return found
