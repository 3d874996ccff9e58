"""ScoreVector: a scorer's result as a list in candidate order, readable as the ``Mapping`` the protocol names.

Hashing an ``Endpoint`` runs Python code (its dataclass ``__hash__``), and a cycle would hash every endpoint
once per scorer to build the result and again to read it. The built-in scorers return a ``ScoreVector`` over
the very sequence they were given; the profile then reads the scores by position. Any other ``Mapping`` works
too, through ``get``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from picker.endpoints.model import Endpoint

__all__ = ["KeyedScores", "ScoreVector"]


class ScoreVector(Mapping[Endpoint, float]):
    __slots__ = ("_index", "endpoints", "scores")

    def __init__(self, endpoints: Sequence[Endpoint], scores: list[float]) -> None:
        if len(endpoints) != len(scores):
            raise ValueError(f"{len(scores)} scores for {len(endpoints)} endpoints")
        self.endpoints = endpoints
        self.scores = scores
        self._index: dict[str, int] | None = None

    @classmethod
    def constant(cls, endpoints: Sequence[Endpoint], value: float) -> ScoreVector:
        return cls(endpoints, [value] * len(endpoints))

    @classmethod
    def fewer_is_better(cls, endpoints: Sequence[Endpoint], values: Sequence[float]) -> ScoreVector:
        """Min-max over the candidates, lowest value 1.0 and highest 0.0; all equal (or none) ⇒ 1.0."""
        if not values:
            return cls(endpoints, [])
        low, high = min(values), max(values)
        if high == low:
            return cls.constant(endpoints, 1.0)
        span = high - low
        return cls(endpoints, [(high - v) / span for v in values])

    def __getitem__(self, endpoint: Endpoint) -> float:
        index = self._index
        if index is None:
            index = self._index = {e.key: i for i, e in enumerate(self.endpoints)}
        return self.scores[index[endpoint.key]]

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(self.endpoints)

    def __len__(self) -> int:
        return len(self.endpoints)

    def __contains__(self, endpoint: object) -> bool:
        key = getattr(endpoint, "key", None)
        if key is None:
            return False
        index = self._index
        if index is None:
            index = self._index = {e.key: i for i, e in enumerate(self.endpoints)}
        return key in index

    def __repr__(self) -> str:
        return f"ScoreVector({dict(zip((e.key for e in self.endpoints), self.scores, strict=True))!r})"

    def as_dict(self) -> Mapping[str, float]:
        return dict(zip((e.key for e in self.endpoints), self.scores, strict=True))


class KeyedScores(Mapping[str, float]):
    """Endpoint key → score, over two parallel lists, indexed only when read.

    A scheduling cycle records every scorer's scores for the explanation, but the explanation is read only at
    debug level or with the explain header; building a dict per scorer per cycle cost O(endpoints) each time.
    """

    __slots__ = ("_index", "_keys", "_values")

    def __init__(self, keys: Sequence[str], values: Sequence[float]) -> None:
        self._keys = keys
        self._values = values
        self._index: dict[str, int] | None = None

    def __getitem__(self, key: str) -> float:
        index = self._index
        if index is None:
            index = self._index = {k: i for i, k in enumerate(self._keys)}
        return self._values[index[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return repr(dict(zip(self._keys, self._values, strict=True)))
