"""The scrape loop: polls every endpoint's ``/metrics`` each ``interval_s`` and publishes what it read.

One tick: take ``store.current()``; start a poll for each endpoint with a ``metrics_url`` that has none in
flight (a slow endpoint's next poll waits for its previous one, so polls never pile up); wait until this
tick's polls are done or the tick is over; publish every finished poll's metrics in **one**
``store.update_metrics``; feed the outcomes to the ``FreshnessTracker`` and apply its transitions
(``store.set_excluded``, one log line each, metrics). A poll still running at the end of a tick is collected
at a later one; a poll of an endpoint that left the pool is cancelled.

Each poll: one GET on the endpoint's keep-alive connection (``picker.scrape.http``), ``timeout_s`` for request
and body, the body capped at ``max_response_bytes``, then ``engines.extract``. The moment the page has arrived,
the poll notes picker's own in-flight requests to that endpoint (``own_requests``, from the ``InflightTracker``)
in the metrics, so the scheduler can tell the server's other traffic from picker's own (``endpoints.serverload``).
On failure
nothing of the endpoint is updated (its old metrics and ``updated_at`` stay), as in the reference; the tracker
decides exclusion. Errors are logged on state changes only (ok→failing, failing→ok, excluded, readmitted), never
per poll.

Requests ask for the classic text format (``Accept: text/plain``) uncompressed (``Accept-Encoding:
identity``): a vLLM server would otherwise gzip its ~50 KB page at level 9 ten times a second on the event loop
that streams tokens, to save in-cluster bandwidth nobody is short of. TLS certificates of ``https`` metrics URLs
are not verified (the reference's ``insecureSkipVerify: true`` default).

Cost: linear in endpoints ÷ interval (measured in docs/performance.md, "Scraping"). The default suits pools of up
to a few dozen endpoints per picker (the reference's interval is shorter); larger pools should raise
``--refresh-metrics-interval``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from picker.endpoints.freshness import REFUSED, Change, FreshnessTracker, Transition
from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.endpoints.store import EndpointStore
from picker.scrape import engines
from picker.scrape.errors import REASONS, ScrapeError
from picker.scrape.http import MetricsClient
from picker.scrape.share import ScrapeShare, SharedScrape
from picker.settings import ScrapeSettings
from picker.telemetry import scrape as telemetry

__all__ = ["run"]

logger = logging.getLogger(__name__)

_HEADERS = {
    "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
    "Accept-Encoding": "identity",
    "User-Agent": "picker",
}


@dataclass(frozen=True, slots=True)
class _Outcome:
    key: str
    metrics: EndpointMetrics | None
    error: ScrapeError | None


async def run(
    *,
    store: EndpointStore,
    settings: ScrapeSettings,
    clock: Callable[[], float],
    own_requests: Callable[[str], int] | None = None,
    share: ScrapeShare | None = None,
) -> None:
    """Poll the store's endpoints until cancelled.
    ``own_requests(key)``: picker's in-flight requests to an endpoint (``InflightTracker.requests``).
    ``share``: poll only the servers this worker owns, publish every outcome, apply the other workers' ones."""
    client = MetricsClient(max_response_bytes=settings.max_response_bytes, headers=_HEADERS)
    poller = _Poller(store, settings, clock, client, own_requests, share)
    try:
        await poller.loop()
    finally:
        await poller.cancel_polls()
        await client.close()


class _Poller:
    def __init__(
        self,
        store: EndpointStore,
        settings: ScrapeSettings,
        clock: Callable[[], float],
        client: MetricsClient,
        own_requests: Callable[[str], int] | None = None,
        share: ScrapeShare | None = None,
    ) -> None:
        if settings.interval_s <= 0 or settings.timeout_s <= 0 or settings.max_response_bytes <= 0:
            raise ValueError("scrape interval_s, timeout_s and max_response_bytes must be positive")
        self._store = store
        self._settings = settings
        self._clock = clock
        self._client = client
        self._own_requests = own_requests
        self._share = share
        if share is not None:
            share.subscribe(self._received)
        self._tracker = FreshnessTracker.from_settings(settings, clock)
        self._urls: dict[str, str] = {}  # tracked endpoint key -> metrics URL
        self._inflight: dict[str, asyncio.Task[_Outcome]] = {}
        self._warned_engines: set[str] = set()

    async def loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval_s = self._settings.interval_s
        next_tick = loop.time()
        while True:
            next_tick += interval_s
            started = self._start_polls()
            if started:
                await asyncio.wait(started, timeout=max(0.0, next_tick - loop.time()))
            self._collect()
            delay = next_tick - loop.time()
            if delay < 0:  # fell behind (a long pause): start afresh rather than burst
                next_tick = loop.time()
                delay = 0.0
            await asyncio.sleep(delay)

    async def cancel_polls(self) -> None:
        tasks = list(self._inflight.values())
        self._inflight.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _start_polls(self) -> list[asyncio.Task[_Outcome]]:
        targets = {e.key: e for e in self._store.current().endpoints if e.metrics_url}
        for key, url in list(self._urls.items()):
            target = targets.get(key)
            if target is None or target.metrics_url != url:  # left the pool, or a new URL: start over
                self._drop(key)
        for key, ep in targets.items():
            if key not in self._urls:
                assert ep.metrics_url is not None
                self._urls[key] = ep.metrics_url
                self._warn_unknown_engine(ep)
        self._tracker.sync(self._urls)
        started: list[asyncio.Task[_Outcome]] = []
        share = self._share
        now = self._clock()
        for key, ep in targets.items():
            if key not in self._inflight and (share is None or share.due(key, now)):
                task = asyncio.create_task(self._poll(ep), name=f"scrape {key}")
                self._inflight[key] = task
                started.append(task)
        return started

    def _drop(self, key: str) -> None:
        self._client.forget(self._urls.pop(key))
        task = self._inflight.pop(key, None)
        if task is not None:
            task.cancel()
        self._tracker.forget(key)
        if self._share is not None:
            self._share.forget(key)
        telemetry.forget_endpoint(key, REASONS)

    def _collect(self) -> None:
        updates: dict[str, EndpointMetrics] = {}
        transitions: list[Transition] = []
        polled: list[_Outcome] = []
        for key, task in list(self._inflight.items()):
            if not task.done():
                continue
            del self._inflight[key]
            outcome = task.result()
            polled.append(outcome)
            if outcome.metrics is not None:
                updates[key] = outcome.metrics
                transitions += self._tracker.success(key)
            elif outcome.error is not None:
                telemetry.SCRAPE_ERRORS.labels(key, outcome.error.reason).inc()
                transitions += self._tracker.failure(key, outcome.error.reason, outcome.error.message)
        share = self._share
        if share is not None and share.publish is not None and polled:
            now = self._clock()
            share.publish([_shared(o, now) for o in polled])
        if updates:
            self._store.update_metrics(updates)
        transitions += self._tracker.check()
        self._apply(transitions)
        for key in self._urls:
            telemetry.ENDPOINT_EXCLUDED.labels(key).set(1.0 if self._tracker.is_excluded(key) else 0.0)
            age_s = self._tracker.age_s(key)
            if age_s is not None:
                telemetry.METRICS_AGE.labels(key).set(age_s)

    def _received(self, scrapes: Sequence[SharedScrape]) -> None:
        """Another worker's polls, applied the moment they arrive as if polled here (not at this poller's next
        tick: that would age them by up to an interval). The poll was counted (duration, errors) where it was made."""
        now = self._clock()
        updates: dict[str, EndpointMetrics] = {}
        transitions: list[Transition] = []
        for s in scrapes:
            if s.key not in self._urls:  # not (or no longer) in this worker's pool
                continue
            if s.metrics is not None:
                updates[s.key] = dataclasses.replace(s.metrics, updated_at=now - s.age_s)
                transitions += self._tracker.success(s.key)
            else:
                transitions += self._tracker.failure(s.key, s.reason, s.message)
        if updates:
            self._store.update_metrics(updates)
        self._apply(transitions)

    def _apply(self, transitions: list[Transition]) -> None:
        excluded: dict[str, bool] = {}
        for t in transitions:
            url = self._urls.get(t.key, "")
            extra = {"endpoint": t.key, "metrics_url": url, "reason": t.reason}
            if t.change is Change.FAILING:
                logger.warning("scrape of %s (%s) failing: %s: %s", t.key, url, t.reason, t.detail, extra=extra)
            elif t.change is Change.OK:
                logger.info("scrape of %s ok again %s", t.key, t.detail, extra=extra)
            elif t.change is Change.EXCLUDED:
                logger.warning("endpoint %s excluded from scheduling: %s: %s", t.key, t.reason, t.detail, extra=extra)
                excluded[t.key] = True
                telemetry.EXCLUSION_TRANSITIONS.labels("excluded", t.reason).inc()
            else:
                logger.info("endpoint %s readmitted to scheduling %s", t.key, t.detail, extra=extra)
                excluded[t.key] = False
                telemetry.EXCLUSION_TRANSITIONS.labels("readmitted", "recovered").inc()
        if excluded:
            self._store.set_excluded(excluded)

    async def _poll(self, ep: Endpoint) -> _Outcome:
        assert ep.metrics_url is not None
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._settings.timeout_s):
                page = await self._client.get(ep.metrics_url)
            own = self._own_requests(ep.key) if self._own_requests is not None else None
            metrics = engines.extract(ep.engine, page, self._clock())
            if own is not None:
                metrics = dataclasses.replace(metrics, own_requests=own)
            return _Outcome(ep.key, metrics, None)
        except ScrapeError as exc:
            return _Outcome(ep.key, None, exc)
        except TimeoutError:
            return _Outcome(ep.key, None, ScrapeError("timeout", f"no complete answer in {self._settings.timeout_s} s"))
        except OSError as exc:
            # Refused: nothing listens (killed, not started yet); freshness excludes at once. Else: maybe transient.
            reason = REFUSED if isinstance(exc, ConnectionRefusedError) else "connect"
            return _Outcome(ep.key, None, ScrapeError(reason, f"{type(exc).__name__}: {exc}"))
        except Exception as exc:  # a bug must not stop the scraping of every endpoint; logged at the transition
            return _Outcome(ep.key, None, ScrapeError("internal", repr(exc)))
        finally:
            telemetry.SCRAPE_DURATION.observe(time.perf_counter() - started)

    def _warn_unknown_engine(self, ep: Endpoint) -> None:
        if not engines.is_known(ep.engine) and ep.engine not in self._warned_engines:
            self._warned_engines.add(ep.engine)
            logger.warning(
                "unknown engine %r (endpoint %s): reading its metrics with the %s mapping",
                ep.engine,
                ep.key,
                engines.DEFAULT_ENGINE,
            )


def _shared(outcome: _Outcome, now: float) -> SharedScrape:
    if outcome.metrics is not None:
        return SharedScrape(outcome.key, max(0.0, now - outcome.metrics.updated_at), outcome.metrics)
    error = outcome.error
    assert error is not None
    return SharedScrape(outcome.key, 0.0, None, error.reason, error.message)
