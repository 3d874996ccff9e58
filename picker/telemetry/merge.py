"""One /metrics page from the pages of several worker processes (``picker serve --workers N``).

Prometheus scrapes the pod once; the workers each count their own share. Per family type:

* counters, histograms and summaries count events: summed sample by sample (``_created``: the earliest);
* gauges that count this process's own work (open streams, leases, queued requests, memory, fds) are summed;
* every other gauge describes the pool (queue sizes, KV use, ready pods, endpoint ages), which each worker reads
  from the same servers: the first worker's value is served, not a sum that would grow with N;
* info and anything else: the first worker's.

A worker that does not answer is left out (the page says how many answered: ``picker_workers{state="scraped"}``);
one that restarted keeps what it counted before in the sums (``CounterCarry``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["ADDITIVE_GAUGES", "CounterCarry", "merge_pages"]

# Gauges of one process's own work: the pod's value is the sum over its workers.
ADDITIVE_GAUGES = frozenset(
    {
        "inference_extension_flow_control_queue_bytes",
        "inference_extension_flow_control_queue_size",
        "inference_objective_running_requests",
        "picker_asyncio_tasks",
        "picker_extproc_streams",
        "picker_inflight_leases",
        "picker_peer_links",  # a worker's links to its siblings
        "picker_peer_states",
        "process_open_fds",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
    }
)
_EARLIEST = frozenset({"process_start_time_seconds"})
_COUNTS = frozenset({"counter", "histogram", "summary"})  # only ever grow within one process

_SampleKey = tuple[str, tuple[tuple[str, str], ...]]


class CounterCarry:
    """Keeps the merged counters monotonic when a worker restarts.

    A restarted worker counts from zero again (and has no series at all until it counts); summed with the others,
    the pod's counter would *drop*, and Prometheus reads any drop as a reset of the whole series (``rate`` then
    counts the other workers' totals again). The supervisor calls ``restarted(worker)`` when it starts a worker
    anew: what that worker had counted, as last seen, is carried into every later sum of the same series."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # merges run in a thread; restarts are noted on the event loop
        self._last: dict[tuple[int, str, _SampleKey], float] = {}
        self._carried: dict[tuple[str, _SampleKey], float] = {}

    def restarted(self, worker: int) -> None:
        with self.lock:
            for at in [at for at in self._last if at[0] == worker]:
                family_key = at[1:]
                self._carried[family_key] = self._carried.get(family_key, 0.0) + self._last.pop(at)

    def seen(self, worker: int, family: str, key: _SampleKey, value: float) -> None:
        self._last[(worker, family, key)] = value

    def carried(self) -> dict[tuple[str, _SampleKey], float]:
        return self._carried


def merge_pages(
    pages: Sequence[str],
    extra: Iterable[Metric] = (),
    *,
    workers: Sequence[int] = (),
    carry: CounterCarry | None = None,
    stale: Collection[int] = (),
) -> bytes:
    """The merged exposition (text format 0.0.4) of ``pages``, in the first page's family order, then ``extra``.
    With ``carry``, ``workers[i]`` names the worker of ``pages[i]``, and the counts of workers that restarted are
    added in (``CounterCarry``). ``stale``: indexes of pages replayed for a worker that did not answer this time;
    only their counts are used (a missing worker must not make the sums drop), not their gauges.

    Raises ``ValueError`` for a page that is not the Prometheus text format."""
    with carry.lock if carry is not None else contextlib.nullcontext():
        return _merge(pages, extra, workers, carry, stale)


def _merge(
    pages: Sequence[str],
    extra: Iterable[Metric],
    workers: Sequence[int],
    carry: CounterCarry | None,
    stale: Collection[int],
) -> bytes:
    families: dict[str, Metric] = {}
    values: dict[str, dict[_SampleKey, float]] = {}
    for index, page in enumerate(pages):
        try:
            parsed = list(text_string_to_metric_families(page))
        except (ValueError, IndexError, KeyError) as exc:
            raise ValueError(f"not a Prometheus text page: {exc}") from exc
        for family in parsed:
            if index in stale and family.type not in _COUNTS:
                continue
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            into = values[family.name]
            how = _how(family)
            counts = carry is not None and family.type in _COUNTS
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                value = sample.value
                if counts and carry is not None and not sample.name.endswith("_created"):
                    carry.seen(workers[index], family.name, key, value)
                old = into.get(key)
                if old is None:
                    into[key] = value
                elif sample.name.endswith("_created") or how == "min":
                    into[key] = min(old, value)
                elif how == "sum":
                    into[key] = old + value
    if carry is not None:
        for (name, key), count in carry.carried().items():
            if name in values:  # every worker exports the same families; none answered: nothing to add to
                values[name][key] = values[name].get(key, 0.0) + count
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed([*families.values(), *extra]))
    return generate_latest(registry)


def _how(family: Metric) -> str:
    if family.type in ("counter", "histogram", "summary", "gaugehistogram"):
        return "sum"
    if family.type == "gauge":
        if family.name in ADDITIVE_GAUGES:
            return "sum"
        if family.name in _EARLIEST:
            return "min"
    return "first"


class _Fixed(Collector):
    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self._families)
