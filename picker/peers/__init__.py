"""Active-active replicas: the exchange of placements and in-flight counts between picker replicas (docs/ha.md).

``exchange`` and ``wire`` are pure (the policy lab runs them in virtual time); ``transport`` carries batches over
gRPC with mutual TLS and ``discovery`` finds the peers (a static list or the picker Service's EndpointSlices).
"""

from picker.peers.exchange import Exchange, ExchangeSettings, ExchangeStats, prefix_scorers
from picker.peers.wire import Batch, Placement, WireError

__all__ = ["Batch", "Exchange", "ExchangeSettings", "ExchangeStats", "Placement", "WireError", "prefix_scorers"]
