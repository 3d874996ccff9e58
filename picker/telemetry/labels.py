"""Bounds on label values that clients choose: each new value would add series to a metric, for good.

Model names and fairness ids come from requests. Past ``limit`` distinct values of one kind, a new value is counted
as ``OTHER`` (values already seen keep their own series), so a client sending a new name with every request cannot
grow picker's memory or its scrape.
"""

from __future__ import annotations

__all__ = ["FAIRNESS_IDS", "MODELS", "OTHER", "BoundedValues"]

OTHER = "__other__"


class BoundedValues:
    __slots__ = ("_seen", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        """``value`` itself if it has (or may still get) series of its own, else ``OTHER``."""
        if value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(value)
        return value


MODELS = BoundedValues(1000)  # model and target model names together
FAIRNESS_IDS = BoundedValues(1000)
