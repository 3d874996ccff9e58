"""EndpointStore: holds the current EndpointSnapshot; every change publishes a new one atomically.

Writers are discovery (membership), the scraper (metrics) and the freshness tracker (exclusion). All run on
the event loop; a writer on another thread hands its change over with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from picker.endpoints.model import Endpoint, EndpointMetrics, EndpointSnapshot

__all__ = ["EndpointStore", "SnapshotListener"]

SnapshotListener = Callable[[EndpointSnapshot], None]


class EndpointStore:
    def __init__(self) -> None:
        self._snapshot = EndpointSnapshot()
        self._listeners: list[SnapshotListener] = []

    def current(self) -> EndpointSnapshot:
        return self._snapshot

    def subscribe(self, listener: SnapshotListener) -> None:
        """Call ``listener`` with every newly published snapshot (after membership changes too)."""
        self._listeners.append(listener)

    def set_endpoints(self, endpoints: Iterable[Endpoint], *, synced: bool = True) -> EndpointSnapshot:
        """Replace the membership. Metrics and exclusion of an endpoint that stays (same key) are kept."""
        old = self._snapshot
        merged: list[Endpoint] = []
        for ep in endpoints:
            prev = old.get(ep.key)
            if prev is not None and prev.metrics_url == ep.metrics_url:
                ep = dataclasses.replace(
                    ep, metrics=prev.metrics, excluded=prev.excluded, ejected=prev.ejected, suspect=prev.suspect
                )
            merged.append(ep)
        return self._publish(tuple(merged), synced=synced)

    def update_metrics(self, updates: Mapping[str, EndpointMetrics]) -> EndpointSnapshot:
        """Set the scraped metrics of the named endpoints; unknown keys (already removed) are ignored."""
        if not updates:
            return self._snapshot
        eps = tuple(
            dataclasses.replace(e, metrics=updates[e.key]) if e.key in updates else e for e in self._snapshot.endpoints
        )
        return self._publish(eps, synced=self._snapshot.synced)

    def set_excluded(self, excluded: Mapping[str, bool]) -> EndpointSnapshot:
        """Mark endpoints as excluded from (True) or readmitted to (False) the candidate set."""
        changed = False
        eps: list[Endpoint] = []
        for e in self._snapshot.endpoints:
            flag = excluded.get(e.key, e.excluded)
            if flag != e.excluded:
                e = dataclasses.replace(e, excluded=flag)
                changed = True
            eps.append(e)
        if not changed:
            return self._snapshot
        return self._publish(tuple(eps), synced=self._snapshot.synced)

    def set_ejected(self, ejected: Mapping[str, bool]) -> EndpointSnapshot:
        """Mark endpoints as ejected by outlier detection (True) or readmitted (False)."""
        return self._set_flag("ejected", ejected)

    def set_suspect(self, suspect: Mapping[str, bool]) -> EndpointSnapshot:
        """Mark endpoints as suspected hung (True) or readmitted (False) by hung-server detection."""
        return self._set_flag("suspect", suspect)

    def _set_flag(self, name: Literal["ejected", "suspect"], values: Mapping[str, bool]) -> EndpointSnapshot:
        eps = self._snapshot.endpoints
        if not any(e.key in values and values[e.key] != getattr(e, name) for e in eps):
            return self._snapshot

        def flagged(e: Endpoint) -> Endpoint:
            if e.key not in values:
                return e
            if name == "ejected":
                return dataclasses.replace(e, ejected=values[e.key])
            return dataclasses.replace(e, suspect=values[e.key])

        return self._publish(tuple(flagged(e) for e in eps), synced=self._snapshot.synced)

    def _publish(self, endpoints: tuple[Endpoint, ...], *, synced: bool) -> EndpointSnapshot:
        snap = EndpointSnapshot(endpoints=endpoints, version=self._snapshot.version + 1, synced=synced)
        self._snapshot = snap
        for listener in self._listeners:
            listener(snap)
        return snap
