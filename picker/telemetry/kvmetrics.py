"""Metrics of the precise prefix path: KV events ingested, the block index, tokenization, scoring sources.

No reference names exist for these (the reference EPP has no KV-event path; llm-d's indexer exports
``kvcache_index_*`` from Go), so they are picker's own, prefixed ``picker_``. Counters that the pure layers keep
as plain ints (``picker.kvcache``'s ``IngestStats`` / ``IndexStats``) are exported at scrape time by
``KVCollector`` from a callback; per-request ones (scoring source, tokenization outcome) are counters here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import Counter
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from picker.telemetry import REGISTRY

__all__ = [
    "SCORE_SOURCES",
    "TOKENIZE",
    "KVCollector",
    "KVSample",
    "ScoreSources",
    "register_kv_collector",
]

SCORE_SOURCES = Counter(
    "picker_precise_prefix_scores",
    "Requests scored by a precise-prefix-cache-scorer, by what it scored with: precise (token ids and the KV-event "
    "index), approximate (no token ids: the fallback index), none (no token ids, no fallback).",
    ("name", "source"),
    registry=REGISTRY,
)
TOKENIZE = Counter(
    "picker_tokenize_requests",
    "Token ids looked up for the precise prefix scorer, by outcome: cache, server, local, prompt (the body "
    "carried token ids), error, timeout, skipped (nothing to tokenize).",
    ("outcome",),
    registry=REGISTRY,
)


class ScoreSources:
    """The three children of ``SCORE_SOURCES`` for one scorer (looked up once, incremented per request)."""

    def __init__(self, name: str) -> None:
        self.precise = SCORE_SOURCES.labels(name, "precise")
        self.approximate = SCORE_SOURCES.labels(name, "approximate")
        self.none = SCORE_SOURCES.labels(name, "none")


@dataclass(frozen=True, slots=True)
class KVSample:
    """One scrape's worth of the KV-event pipeline's plain counters."""

    messages: Mapping[str, int]  # outcome → messages
    malformed: Mapping[str, int]  # reason → messages
    resyncs: Mapping[str, int]  # reason → resyncs
    events: int
    gaps: int
    missed_batches: int
    restarts: int
    index_entries: int
    index_keys: int
    index: Mapping[str, int]  # IndexStats counters


class KVCollector(Collector):
    def __init__(self, sample: Callable[[], KVSample]) -> None:
        self._sample = sample

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        return iter(())  # computed lazily; nothing to check at registration (as the pool collector)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._sample()
        messages = CounterMetricFamily(
            "picker_kv_event_messages", "KV-event messages received, by outcome.", labels=("outcome",)
        )
        for outcome, n in s.messages.items():
            messages.add_metric((outcome,), n)
        yield messages
        malformed = CounterMetricFamily(
            "picker_kv_event_malformed", "KV-event messages dropped as malformed, by reason.", labels=("reason",)
        )
        for reason, n in s.malformed.items():
            malformed.add_metric((reason,), n)
        yield malformed
        resyncs = CounterMetricFamily(
            "picker_kv_event_resyncs",
            "Endpoints whose index entries were dropped because their event stream broke, by reason.",
            labels=("reason",),
        )
        for reason, n in s.resyncs.items():
            resyncs.add_metric((reason,), n)
        yield resyncs
        yield CounterMetricFamily("picker_kv_events", "KV events applied to the index.", value=s.events)
        yield CounterMetricFamily(
            "picker_kv_event_sequence_gaps", "Sequence gaps seen in KV-event streams.", value=s.gaps
        )
        yield CounterMetricFamily(
            "picker_kv_event_missed_batches", "KV-event batches missed in sequence gaps.", value=s.missed_batches
        )
        yield CounterMetricFamily(
            "picker_kv_event_publisher_restarts", "KV-event publishers seen restarting.", value=s.restarts
        )
        yield GaugeMetricFamily(
            "picker_kv_index_entries", "(block, endpoint) entries in the KV-block index.", value=s.index_entries
        )
        yield GaugeMetricFamily(
            "picker_kv_index_keys", "Distinct block keys in the KV-block index.", value=s.index_keys
        )
        ops = CounterMetricFamily(
            "picker_kv_index_operations", "KV-block index operations, by kind.", labels=("operation",)
        )
        for op, n in s.index.items():
            ops.add_metric((op,), n)
        yield ops


def register_kv_collector(sample: Callable[[], KVSample]) -> KVCollector:
    collector = KVCollector(sample)
    REGISTRY.register(collector)
    return collector
