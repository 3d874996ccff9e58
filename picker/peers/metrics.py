"""The peer exchange's own metrics, read from its counters at scrape time (nothing on the hot path).

* ``picker_peer_links{state}`` gauge: ``configured`` (peers known), ``connected`` (links streaming now);
* ``picker_peer_states`` gauge: peers whose in-flight counts currently count (reported within the TTL);
* ``picker_peer_batches_total{direction}`` counter: ``sent``, ``received``, ``rejected`` (bad bytes), ``lost``
  (sequence gaps), ``dropped`` (a full link queue);
* ``picker_peer_bytes_total{direction}`` counter: ``sent``, ``received``;
* ``picker_peer_placements_dropped_total`` counter: placements over the pending bound between two flushes;
* ``picker_peer_scrapes_total{direction}`` counter: poll outcomes shared between a pod's workers, ``sent`` (once
  per peer), ``received``, ``dropped`` (over the pending bound between two flushes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from picker.endpoints.peerload import PeerLoads
from picker.peers.exchange import Exchange
from picker.peers.transport import Mesh
from picker.telemetry import REGISTRY

__all__ = ["PeerCollector", "register"]


class PeerCollector(Collector):
    def __init__(self, exchange: Exchange, mesh: Mesh, loads: PeerLoads, clock: Callable[[], float]) -> None:
        self._exchange = exchange
        self._mesh = mesh
        self._loads = loads
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        stats = self._exchange.stats
        links = GaugeMetricFamily("picker_peer_links", "Peer links of the exchange, by state.", labels=("state",))
        links.add_metric(("configured",), float(len(self._exchange.peers)))
        links.add_metric(("connected",), float(len(self._mesh.connected)))
        states = GaugeMetricFamily("picker_peer_states", "Peers whose in-flight counts currently count.")
        states.add_metric((), float(len(self._loads.peers(self._clock()))))
        batches = CounterMetricFamily(
            "picker_peer_batches", "Peer exchange batches, by direction.", labels=("direction",)
        )
        for direction, value in (
            ("sent", stats.batches_sent),
            ("received", stats.batches_received),
            ("rejected", stats.batches_rejected),
            ("lost", stats.batches_lost),
            ("dropped", self._mesh.dropped_batches),
        ):
            batches.add_metric((direction,), float(value))
        size = CounterMetricFamily("picker_peer_bytes", "Peer exchange bytes, by direction.", labels=("direction",))
        size.add_metric(("sent",), float(stats.bytes_sent))
        size.add_metric(("received",), float(stats.bytes_received))
        dropped = CounterMetricFamily(
            "picker_peer_placements_dropped", "Placements dropped over the pending bound between two flushes."
        )
        dropped.add_metric((), float(stats.placements_dropped))
        scrapes = CounterMetricFamily(
            "picker_peer_scrapes", "Poll outcomes shared between a pod's workers, by direction.", labels=("direction",)
        )
        scrapes.add_metric(("sent",), float(stats.scrapes_sent))
        scrapes.add_metric(("received",), float(stats.scrapes_received))
        scrapes.add_metric(("dropped",), float(stats.scrapes_dropped))
        yield from (links, states, batches, size, dropped, scrapes)

    def describe(self) -> Iterable[Metric]:
        return ()


def register(exchange: Exchange, mesh: Mesh, loads: PeerLoads, clock: Callable[[], float]) -> PeerCollector:
    """Register the collector in picker's registry (unregister with ``REGISTRY.unregister``)."""
    collector = PeerCollector(exchange, mesh, loads, clock)
    REGISTRY.register(collector)
    return collector
