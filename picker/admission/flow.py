"""Flow control (``featureGates: [flowControl]``): every request waits its turn while the pool is saturated.

``FlowController.admit`` is the director's ``Admitter``. A request goes straight through when nothing is queued
and the pool's saturation is below the ceiling (1.0, or a ``static-usage-limit-policy``'s threshold); otherwise it
is queued (``FlowQueue``: priority bands, fairness between fairness ids, ordering) and waits on a future until:

* dispatched: a dispatch pass finds saturation below the ceiling and the request next in line. Passes run when a
  request is queued, when the endpoint snapshot changes (every scrape publishes one) and when an in-flight lease
  is released (``released``). A pass dispatches one request and schedules the next pass with ``call_soon``, after
  the woken request's own continuation — which schedules it and takes its in-flight lease without awaiting — so
  a detector counting in-flight requests sees each dispatch before deciding the next;
* its TTL passes (``defaultRequestTTL``, or its band's): 503 ``request timed out in queue: …``;
* the client goes away (the stream's task is cancelled): removed, outcome ``EvictedContextCancelled``;
* rejected before queueing when a capacity would be exceeded: 429 (``ResourceExhausted``).

Saturation is measured over the whole pool (the reference's dispatch cycle), not the request's subset. Decisions
are plain functions of the queue, the detector and the injected clock; only the waiting uses asyncio.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
from collections.abc import Callable, Sequence

from picker import errors
from picker.admission.flowconfig import FlowConfig
from picker.admission.queue import FlowQueue, QueuedRequest
from picker.admission.saturation import SaturationDetector
from picker.endpoints.model import Endpoint, EndpointSnapshot
from picker.request.model import InferenceRequest
from picker.request.slo import slo_of
from picker.telemetry import flow as fm
from picker.telemetry import labels

__all__ = ["REJECTED_PREFIX", "TTL_MESSAGE", "FlowController"]

log = logging.getLogger(__name__)

REJECTED_PREFIX = "request rejected pre-queue: "
TTL_MESSAGE = "request timed out in queue: request evicted from queue: request TTL expired"


class FlowController:
    def __init__(
        self,
        *,
        detector: SaturationDetector,
        candidates: Callable[[], Sequence[Endpoint]],
        clock: Callable[[], float],
        config: FlowConfig | None = None,
        pool_name: str = "",
    ) -> None:
        self.detector = detector
        self.config = config or FlowConfig()
        self.queue = FlowQueue(self.config)
        self.clock = clock
        self.pool_name = pool_name
        self._candidates = candidates
        self._seq = itertools.count()
        self._pass_pending = False
        self._saturation_gauge = fm.POOL_SATURATION.labels(pool_name)

    # -- the Admitter seam -------------------------------------------------------------------------------

    async def admit(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> None:
        """Return when the request may be scheduled; raise a ``PickerError`` to reject it."""
        now = self.clock()
        if not self.queue and self.saturation() < self.config.ceiling:
            self._observe(req, fm.DISPATCHED, 0.0)
            return
        size = len(req.body)
        reason = self.queue.capacity_error(req.priority, size)
        if reason is not None:
            self._observe(req, fm.REJECTED_CAPACITY, 0.0)
            raise errors.ResourceExhausted(REJECTED_PREFIX + reason)
        ttl_s = self.config.ttl_s(req.priority)
        item = QueuedRequest(
            req=req,
            priority=req.priority,
            flow=req.fairness_id,
            size_bytes=size,
            enqueued_at=now,
            deadline=now + ttl_s if ttl_s is not None else None,
            seq=next(self._seq),
            slo_deadline=_slo_deadline(req, now),
        )
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        item.waiter = waiter
        if ttl_s is not None:
            item.timer = loop.call_later(ttl_s, self._on_timer)
        self.queue.push(item)
        self._gauges(item, +1)
        self.poke()
        try:
            await waiter
        except asyncio.CancelledError:
            if self.queue.remove(item):
                self._finish(item, fm.EVICTED_CANCELLED)
            elif waiter.done() and not waiter.cancelled():
                waiter.exception()  # retrieved: it was evicted just as the client left
            raise

    # -- signals -----------------------------------------------------------------------------------------

    def released(self) -> None:
        """An in-flight lease was released: capacity may have freed up."""
        self.poke()

    def on_snapshot(self, snapshot: EndpointSnapshot) -> None:
        """An ``EndpointStore`` listener: new metrics or membership may have freed capacity."""
        self.poke()

    def poke(self) -> None:
        """Schedule a dispatch pass (at most one pending)."""
        if self._pass_pending or not self.queue:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nobody can be waiting either
            return
        self._pass_pending = True
        loop.call_soon(self._dispatch_pass)

    # -- decisions ---------------------------------------------------------------------------------------

    def saturation(self) -> float:
        value = self.detector.saturation(self._candidates())
        self._saturation_gauge.set(value)
        return value

    def dispatch_one(self) -> QueuedRequest | None:
        """Dispatch the next waiting request if the pool is below the ceiling; the request, or None."""
        if not self.queue or self.saturation() >= self.config.ceiling:
            return None
        while (item := self.queue.pop()) is not None:
            if item.waiter is not None and item.waiter.done():  # its client left before this pass
                self._finish(item, fm.EVICTED_CANCELLED)
                continue
            self._finish(item, fm.DISPATCHED)
            if item.waiter is not None:
                item.waiter.set_result(None)
            return item
        return None

    def expire(self, now: float | None = None) -> list[QueuedRequest]:
        """Evict every request whose TTL has passed (503). Returns them."""
        due = self.queue.expired(self.clock() if now is None else now)
        for item in due:
            self._finish(item, fm.EVICTED_TTL)
            if item.waiter is not None and not item.waiter.done():
                item.waiter.set_exception(errors.ServiceUnavailable(TTL_MESSAGE))
        return due

    def _dispatch_pass(self) -> None:
        self._pass_pending = False
        try:
            dispatched = self.dispatch_one()
        except Exception:  # a detector bug must not strand the queue silently
            log.exception("flow control dispatch failed")
            return
        if dispatched is not None:
            self.poke()  # runs after the dispatched request's continuation (call_soon order)

    def _on_timer(self) -> None:
        self.expire()
        self.poke()

    # -- accounting --------------------------------------------------------------------------------------

    def _finish(self, item: QueuedRequest, outcome: str) -> None:
        if item.timer is not None:
            item.timer.cancel()
            item.timer = None
        self._gauges(item, -1)
        self._observe(item.req, outcome, max(0.0, self.clock() - item.enqueued_at))

    def _observe(self, req: InferenceRequest, outcome: str, waited_s: float) -> None:
        fm.QUEUE_DURATION.labels(
            labels.FAIRNESS_IDS(req.fairness_id),
            str(req.priority),
            outcome,
            self.pool_name,
            labels.MODELS(req.model),
            labels.MODELS(req.target_model),
        ).observe(waited_s)

    def _gauges(self, item: QueuedRequest, sign: int) -> None:
        req = item.req
        values = (
            labels.FAIRNESS_IDS(item.flow),
            str(item.priority),
            self.pool_name,
            labels.MODELS(req.model),
            labels.MODELS(req.target_model),
        )
        fm.QUEUE_SIZE.labels(*values).inc(sign)
        fm.QUEUE_BYTES.labels(*values).inc(sign * item.size_bytes)


def _slo_deadline(req: InferenceRequest, now: float) -> float:
    """When the request's TTFT objective runs out (``slo-deadline-ordering-policy``); inf without one."""
    slo = slo_of(req)
    return now + slo.ttft_s if slo is not None and slo.ttft_s is not None else math.inf
