"""One /metrics page from the pages of several worker processes (``picker serve --workers N``).

Prometheus scrapes the pod once; the workers each count their own share. Per family type:

* counters, histograms and summaries count events: summed sample by sample (``_created``: the earliest);
* gauges that count this process's own work (open streams, leases, queued requests, memory, fds) are summed;
* every other gauge describes the pool (queue sizes, KV use, ready pods, endpoint ages), which each worker reads
  from the same servers: the first worker's value is served, not a sum that would grow with N;
* info and anything else: the first worker's.

A worker that does not answer is left out (the page says how many answered: ``picker_workers{state="scraped"}``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["ADDITIVE_GAUGES", "merge_pages"]

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

_SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def merge_pages(pages: Sequence[str], extra: Iterable[Metric] = ()) -> bytes:
    """The merged exposition (text format 0.0.4) of ``pages``, in the first page's family order, then ``extra``.

    Raises ``ValueError`` for a page that is not the Prometheus text format."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[_SampleKey, float]] = {}
    for page in pages:
        try:
            parsed = list(text_string_to_metric_families(page))
        except (ValueError, IndexError, KeyError) as exc:
            raise ValueError(f"not a Prometheus text page: {exc}") from exc
        for family in parsed:
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                values[family.name] = {}
            into = values[family.name]
            how = _how(family)
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = into.get(key)
                if old is None:
                    into[key] = sample.value
                elif sample.name.endswith("_created") or how == "min":
                    into[key] = min(old, sample.value)
                elif how == "sum":
                    into[key] = old + sample.value
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
