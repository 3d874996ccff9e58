"""Gauges of picker's own health, read at scrape time: what a soak test watches for leaks.

``picker_inflight_leases`` (requests routed and not yet finished, over every endpoint, including ones that left
the pool), ``picker_extproc_streams`` (open ext_proc streams), ``picker_asyncio_tasks`` (tasks alive on picker's
event loop), and the standard ``process_*`` gauges (resident memory, open file descriptors, CPU seconds).
Exposition runs in a worker thread; the values read here are plain integers and ``asyncio.all_tasks(loop)``,
which is safe to call from another thread (it copies the task set, retrying if the loop changes it meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

from prometheus_client import ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from picker.telemetry import REGISTRY

__all__ = ["RuntimeCollector", "register_runtime_collectors"]


class RuntimeCollector(Collector):
    def __init__(
        self, loop: asyncio.AbstractEventLoop, *, leases: Callable[[], int], streams: Callable[[], int]
    ) -> None:
        self._loop = loop
        self._leases = leases
        self._streams = streams

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("picker_inflight_leases", "Requests routed and not yet finished", self._leases())
        yield GaugeMetricFamily("picker_extproc_streams", "Open ext_proc streams", self._streams())
        yield GaugeMetricFamily(
            "picker_asyncio_tasks", "Tasks alive on picker's event loop", len(asyncio.all_tasks(self._loop))
        )


def register_runtime_collectors(
    loop: asyncio.AbstractEventLoop, *, leases: Callable[[], int], streams: Callable[[], int]
) -> list[Collector]:
    """Register the runtime and process collectors; unregister each with ``REGISTRY.unregister`` on shutdown."""
    collectors: list[Collector] = [RuntimeCollector(loop, leases=leases, streams=streams)]
    collectors.append(ProcessCollector(registry=None))
    for collector in collectors:
        REGISTRY.register(collector)
    return collectors
