"""The flow-control queue: priority bands → flows (fairness ids) → requests. Pure: no loop, no clock.

Dispatch order (scheduling.md §9): the highest priority band with a waiting request goes first (strict
priority); inside a band the fairness policy picks a flow and the ordering policy picks that flow's request.

* ``global-strict-fairness-policy``: the flow whose next request comes first by the ordering policy (so with
  FCFS the band is one FIFO across flows).
* ``round-robin-fairness-policy``: flows take turns, one request each, in the order they became active; a flow
  that empties leaves the rotation and rejoins at its end.
* ``fcfs-ordering-policy``: arrival order; ``edf-ordering-policy``: earliest deadline (arrival + TTL) first,
  requests without a deadline after, by arrival; ``slo-deadline-ordering-policy``: the same with the deadline
  arrival + the request's TTFT objective (SLO headers).

Capacity: global ``maxRequests`` / ``maxBytes`` and each band's; a request that would exceed one is rejected
before it is queued (``capacity_error``).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from picker.admission.flowconfig import BandConfig, FlowConfig
from picker.request.model import InferenceRequest
from picker.scheduling.plugins import flow_policies as fp

__all__ = ["FlowQueue", "QueuedRequest"]


@dataclass(eq=False, slots=True)
class QueuedRequest:
    req: InferenceRequest
    priority: int
    flow: str  # fairness id
    size_bytes: int
    enqueued_at: float
    deadline: float | None  # clock seconds; None: no TTL
    seq: int  # arrival order
    # enqueued_at + the request's TTFT objective (SLO headers); inf without one
    slo_deadline: float = math.inf
    waiter: asyncio.Future[None] | None = field(default=None, repr=False)
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class _Band:
    __slots__ = ("bytes", "config", "count", "flows", "priority")

    def __init__(self, priority: int, config: BandConfig) -> None:
        self.priority = priority
        self.config = config
        # Active flows in rotation order (dict order); a flow is removed when it empties.
        self.flows: dict[str, deque[QueuedRequest]] = {}
        self.count = 0
        self.bytes = 0

    def key(self, item: QueuedRequest) -> tuple[float, int]:
        ordering = self.config.ordering
        if ordering == fp.EDF:
            return (item.deadline if item.deadline is not None else math.inf, item.seq)
        if ordering == fp.SLO_DEADLINE:
            return (item.slo_deadline, item.seq)
        return (0.0, item.seq)

    def head(self, items: deque[QueuedRequest]) -> QueuedRequest:
        if self.config.ordering != fp.FCFS:
            return min(items, key=self.key)
        return items[0]

    def pop(self) -> QueuedRequest | None:
        if not self.flows:
            return None
        if self.config.fairness == fp.ROUND_ROBIN:
            flow = next(iter(self.flows))
        else:
            flow = min(self.flows, key=lambda f: self.key(self.head(self.flows[f])))
        items = self.flows.pop(flow)
        item = self.head(items)
        items.remove(item)
        if items:
            self.flows[flow] = items  # back in at the end: the next flow's turn
        self.count -= 1
        self.bytes -= item.size_bytes
        return item


class FlowQueue:
    def __init__(self, config: FlowConfig) -> None:
        self.config = config
        self._bands: dict[int, _Band] = {}
        self._order: list[int] = []  # band priorities, highest first
        self.count = 0
        self.bytes = 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[QueuedRequest]:
        for priority in self._order:
            for items in self._bands[priority].flows.values():
                yield from items

    def capacity_error(self, priority: int, size_bytes: int) -> str | None:
        """Why a request of this size can't be queued at this priority; None when it can."""
        config = self.config
        if config.max_requests is not None and self.count + 1 > config.max_requests:
            return "queue at capacity and displacement failed to make space"
        if config.max_bytes is not None and self.bytes + size_bytes > config.max_bytes:
            return "queue at capacity and displacement failed to make space"
        band_config = config.band(priority)
        band = self._bands.get(priority)
        count, used = (band.count, band.bytes) if band is not None else (0, 0)
        if band_config.max_requests is not None and count + 1 > band_config.max_requests:
            return "queue at capacity and displacement failed to make space"
        if band_config.max_bytes is not None and used + size_bytes > band_config.max_bytes:
            return "queue at capacity and displacement failed to make space"
        return None

    def push(self, item: QueuedRequest) -> None:
        band = self._bands.get(item.priority)
        if band is None:
            band = self._bands[item.priority] = _Band(item.priority, self.config.band(item.priority))
            self._order = sorted(self._bands, reverse=True)
        items = band.flows.get(item.flow)
        if items is None:
            items = band.flows[item.flow] = deque()
        items.append(item)
        band.count += 1
        band.bytes += item.size_bytes
        self.count += 1
        self.bytes += item.size_bytes

    def pop(self) -> QueuedRequest | None:
        """The next request to dispatch (strict priority, then the band's policies); None when empty."""
        for priority in self._order:
            item = self._bands[priority].pop()
            if item is not None:
                self.count -= 1
                self.bytes -= item.size_bytes
                return item
        return None

    def remove(self, item: QueuedRequest) -> bool:
        """Take a waiting request out (client gone, TTL). False if it is not queued (already dispatched)."""
        band = self._bands.get(item.priority)
        items = band.flows.get(item.flow) if band is not None else None
        if band is None or items is None:
            return False
        try:
            items.remove(item)
        except ValueError:
            return False
        if not items:
            del band.flows[item.flow]
        band.count -= 1
        band.bytes -= item.size_bytes
        self.count -= 1
        self.bytes -= item.size_bytes
        return True

    def expired(self, now: float) -> list[QueuedRequest]:
        """Remove and return every request whose deadline has passed."""
        due = [item for item in self if item.deadline is not None and item.deadline <= now]
        for item in due:
            self.remove(item)
        return due
