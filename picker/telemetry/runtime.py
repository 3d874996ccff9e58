"""Gauges of picker's own health, read at scrape time: what a soak test watches for leaks.

``picker_inflight_leases`` (requests routed and not yet finished, over every endpoint, including ones that left
the pool), ``picker_extproc_streams`` (open ext_proc streams), ``picker_asyncio_tasks`` (tasks alive on picker's
event loop), and the standard ``process_*`` gauges (resident memory, open file descriptors, CPU seconds).
Exposition runs in a worker thread; the values read here are plain integers and ``asyncio.all_tasks(loop)``,
which is safe to call from another thread (it copies the task set, retrying if the loop changes it meanwhile).

One process normally runs one picker; tests run several in one process, so the collectors are registered once
and sum over every running picker (``Source``), each added and removed by its own ``serving``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from picker.telemetry import REGISTRY

__all__ = ["RuntimeCollector", "Source", "add_source", "remove_source"]


@dataclass(frozen=True, eq=False, slots=True)
class Source:
    loop: asyncio.AbstractEventLoop
    leases: Callable[[], int]
    streams: Callable[[], int]


class RuntimeCollector(Collector):
    def __init__(self) -> None:
        self.sources: list[Source] = []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        sources = list(self.sources)
        loops = {id(s.loop): s.loop for s in sources}
        tasks = sum(len(asyncio.all_tasks(loop)) for loop in loops.values())
        yield GaugeMetricFamily(
            "picker_inflight_leases", "Requests routed and not yet finished", sum(s.leases() for s in sources)
        )
        yield GaugeMetricFamily("picker_extproc_streams", "Open ext_proc streams", sum(s.streams() for s in sources))
        yield GaugeMetricFamily("picker_asyncio_tasks", "Tasks alive on picker's event loop", tasks)


_lock = threading.Lock()
_runtime = RuntimeCollector()
_process = ProcessCollector(registry=None)


def add_source(source: Source) -> Source:
    """Count a running picker in the runtime gauges (registers the collectors with the first one)."""
    with _lock:
        if not _runtime.sources:
            REGISTRY.register(_runtime)
            REGISTRY.register(_process)
        _runtime.sources.append(source)
    return source


def remove_source(source: Source) -> None:
    with _lock:
        if source in _runtime.sources:
            _runtime.sources.remove(source)
            if not _runtime.sources:
                REGISTRY.unregister(_runtime)
                REGISTRY.unregister(_process)
