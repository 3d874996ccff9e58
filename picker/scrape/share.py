"""One scrape per server per interval for a pod's workers, not one per worker.

Without sharing, each of ``--workers N`` polls every model server, so every server answers N times as many
``/metrics`` requests as with one picker (a vLLM server renders its ~50 KB page on the event loop that streams
tokens) and every worker spends the parse CPU of the whole pool. With a ``ScrapeShare`` worker ``index`` polls the
servers whose key hashes to it (``owns``), and the pod's peer exchange carries every outcome, a page's metrics or
a failure, to the other workers, whose pollers apply it the moment it arrives, as if they had polled
(``picker.scrape.poller``): the same metrics, the same freshness and exclusion decisions, one poll per server.

A worker polls a server it does not own too until it first hears about it (at start, before the links between
the workers are up; when a server joins the pool), and when it has heard nothing about it for ``takeover_s``:
the owner died and is being restarted, or cannot reach its peers. It stops again as soon as the owner's outcomes
arrive. Only a pod's own workers share scrapes: replicas in other pods keep their own view of the servers, so one
replica's network trouble is not every replica's.

``SharedScrape.age_s`` is the page's age when the owner published it; the receiver dates the metrics from its own
clock, so they read at most one exchange flush (the workers' flush interval) younger than they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

from picker.endpoints.model import EndpointMetrics

__all__ = ["ScrapeShare", "SharedScrape"]

_MAX_HEARD = 65_536


@dataclass(frozen=True, slots=True)
class SharedScrape:
    """One poll's outcome as the worker that made it tells the others."""

    key: str  # the server (ip:port)
    age_s: float  # how long before publishing the page was read (or the poll failed)
    metrics: EndpointMetrics | None  # None: the poll failed
    reason: str = ""  # the failure's reason (picker.scrape.errors.REASONS), when metrics is None
    message: str = ""  # the failure's detail, for the logs


class ScrapeShare:
    """Which servers this worker polls; hands the other workers' outcomes to this worker's poller."""

    def __init__(self, index: int, count: int, *, takeover_s: float) -> None:
        if not 0 <= index < count:
            raise ValueError(f"worker {index} of {count}")
        if takeover_s <= 0:
            raise ValueError("takeover_s must be positive")
        self.index = index
        self.count = count
        self.takeover_s = takeover_s
        # Set by the wiring (app/root.py): hands this worker's outcomes to the exchange.
        self.publish: Callable[[list[SharedScrape]], None] | None = None
        self._listener: Callable[[Sequence[SharedScrape]], None] | None = None
        self._heard: dict[str, float] = {}  # server -> when an outcome about it last arrived
        self._owned: dict[str, bool] = {}

    def owns(self, key: str) -> bool:
        owned = self._owned.get(key)
        if owned is None:
            owned = self._owned[key] = xxhash.xxh64_intdigest(key.encode()) % self.count == self.index
        return owned

    def due(self, key: str, now: float) -> bool:
        """Whether this worker should poll ``key`` itself: it owns it, or nobody told it about it lately. A server
        nobody has told it about yet is polled here too (at start, before the workers' links are up, and when a
        server joins), so a worker has its metrics as soon as it would have polling alone."""
        if self.owns(key):
            return True
        heard = self._heard.get(key)
        return heard is None or now - heard >= self.takeover_s

    def subscribe(self, listener: Callable[[Sequence[SharedScrape]], None]) -> None:
        """The poller: told the other workers' outcomes as they arrive."""
        self._listener = listener

    def receive(self, scrapes: Sequence[SharedScrape], now: float) -> None:
        """Another worker's outcomes (the exchange calls this)."""
        heard = self._heard
        for s in scrapes:
            heard[s.key] = now
        while len(heard) > _MAX_HEARD:  # servers of other workers' pools only: forgetting one costs one poll here
            del heard[next(iter(heard))]
        if self._listener is not None:
            self._listener(scrapes)

    def forget(self, key: str) -> None:
        """The server left the pool."""
        self._heard.pop(key, None)
        self._owned.pop(key, None)
