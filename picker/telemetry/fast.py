"""A lean histogram for the per-request hot path, exported through prometheus_client's registry.

prometheus_client's ``Histogram.labels(...).observe(v)`` validates labels, takes a lock per bucket increment and
scans the bounds linearly: ~5 µs per observation, and a request makes about seventeen (plugin timings, sizes,
tokens, durations). picker updates metrics only on the event loop thread, so a series here is two plain Python
values updated with a ``bisect``: ~0.5 µs. Label children are cached.

The exposition (``collect``) may run in another thread: it copies the bucket list in one step (atomic under the
GIL), so a scrape sees every bucket consistent with the count; ``_sum`` may lag the count by an observation in
flight, which Prometheus tolerates (``rate(sum)/rate(count)`` over a scrape interval).
"""

from __future__ import annotations

import itertools
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

__all__ = ["Children", "FastHistogram", "Series"]

C = TypeVar("C", covariant=True)


class _Labeled(Protocol[C]):
    def labels(self, *values: str) -> C: ...

    def remove(self, *values: str) -> None: ...


class Children(Generic[C]):
    """Memoised ``metric.labels(...)``: prometheus_client validates and locks on every call (~3 µs)."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: _Labeled[C]) -> None:
        self._metric = metric
        self._cache: dict[tuple[str, ...], C] = {}

    def __call__(self, *values: str) -> C:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._metric.labels(*values)
        return child

    def retain(self, keep: Callable[[tuple[str, ...]], bool]) -> int:
        """Drop the series whose label values ``keep`` refuses (from the metric too). Returns how many."""
        gone = [values for values in self._cache if not keep(values)]
        for values in gone:
            del self._cache[values]
            self._metric.remove(*values)
        return len(gone)


class Series:
    """One label set of a ``FastHistogram``."""

    __slots__ = ("_bounds", "counts", "total")

    def __init__(self, bounds: list[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # per bucket (not cumulative); the last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self._bounds, value)] += 1
        self.total += value


class FastHistogram:
    """A histogram with label names, ``labels(*values).observe(v)`` like prometheus_client's."""

    _type = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._labelnames = tuple(labelnames)
        self._bounds = sorted(float(b) for b in buckets)
        self._series: dict[tuple[str, ...], Series] = {}
        self._upper_bounds = [*self._bounds, float("inf")]  # as prometheus_client names it (tests read it)
        registry.register(self)

    def labels(self, *values: str) -> Series:
        series = self._series.get(values)
        if series is None:
            if len(values) != len(self._labelnames):
                raise ValueError(f"{self._name}: expected labels {self._labelnames}, got {values}")
            series = self._series[values] = Series(self._bounds)
        return series

    def observe(self, value: float) -> None:
        """For a histogram without labels."""
        self.labels().observe(value)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)
        les = [_le(b) for b in self._upper_bounds]
        for values, series in list(self._series.items()):
            counts = series.counts[:]  # one step: consistent buckets
            cumulative = list(itertools.accumulate(counts))
            family.add_metric(list(values), list(zip(les, cumulative, strict=True)), series.total)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=self._labelnames)


def _le(bound: float) -> str:
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]
