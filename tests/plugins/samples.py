"""User plugins for the tests, loaded the way users load theirs: ``type: tests.plugins.samples:ClassName``.

Each is small and does one thing a test needs: a well-behaved scorer / filter / picker in each parameter
style, ones that raise, run long (on the FakeClock) or return what the contract refuses, and classes that break
the protocol in one way each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from picker.plugins import (
    ROTATE_TIES,
    Category,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginContext,
    PluginParams,
    ProfileResult,
    ResponseInfo,
    SchedulingResult,
    ScoredEndpoint,
    Scores,
)


@dataclass(frozen=True)
class TenantParams:
    header_name: str = "x-tenant"
    label: str = "tenant"


class TenantScorer:
    """1.0 where label == header value (a Mapping result, dataclass params)."""

    category: ClassVar[Category] = Category.AFFINITY

    def __init__(self, name: str, params: TenantParams) -> None:
        self.name = name
        self.params = params

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        wanted = req.headers.get(self.params.header_name)
        return {e: 1.0 for e in endpoints if wanted is not None and e.labels.get(self.params.label) == wanted}


class FavouriteParams(PluginParams):
    key: str  # required
    score: float = 1.0


class FavouriteScorer:
    """``score`` for the endpoint ``key``, 0 elsewhere (a sequence result, pydantic params)."""

    def __init__(self, params: FavouriteParams) -> None:
        self.params = params

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return [self.params.score if e.key == self.params.key else 0.0 for e in endpoints]


class EvenScorer:
    """The same score everywhere, and the request's ties taken in turn (``ROTATE_TIES``) unless ``x-random``."""

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        if "x-random" not in req.headers:
            cycle[ROTATE_TIES] = True
        return [0.5] * len(endpoints)


class FlakyScorer:
    """Raises when the request has the header ``x-fail``; else prefers the last endpoint."""

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        if "x-fail" in req.headers:
            raise RuntimeError("flaky scorer failed on purpose")
        return [1.0 if i == len(endpoints) - 1 else 0.0 for i in range(len(endpoints))]


@dataclass(frozen=True)
class SlowParams:
    cost_ms: float = 10.0  # virtual time each call takes
    favourite: int = 0  # index of the endpoint it prefers


class SlowScorer:
    """Takes ``cost_ms`` on the context's clock (a FakeClock in tests) and prefers one endpoint."""

    def __init__(self, params: SlowParams, ctx: PluginContext) -> None:
        self.params = params
        self.advance = getattr(ctx.clock, "advance")  # noqa: B009 — the FakeClock's, not in the protocol
        self.calls = 0

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        self.calls += 1
        self.advance(self.params.cost_ms / 1e3)
        return [1.0 if i == self.params.favourite else 0.0 for i in range(len(endpoints))]


@dataclass(frozen=True)
class ReturnParams:
    kind: str = "string"


class BadResultScorer:
    """Returns what the score contract refuses."""

    def __init__(self, params: ReturnParams) -> None:
        self.kind = params.kind

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Any:
        if self.kind == "string":
            return "high"
        if self.kind == "short":
            return [1.0] * (len(endpoints) - 1)
        if self.kind == "none-values":
            return [None] * len(endpoints)
        return None


class OddFilter:
    """Keeps the endpoints at even positions; raises when the request has ``x-fail``."""

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        if "x-fail" in req.headers:
            raise KeyError("x-fail")
        return [e for i, e in enumerate(endpoints) if i % 2 == 0]


class ForeignFilter:
    """Returns an endpoint it was not given."""

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        return [Endpoint.create("10.9.9.9", 1)]


class LowestPicker:
    """Picks the lowest total (the opposite of max-score); raises when the request has ``x-fail``."""

    def __init__(self) -> None:
        self.fail = False

    def pick(self, scored: Sequence[ScoredEndpoint], cycle: CycleState) -> ProfileResult:
        if self.fail:
            raise ValueError("picker failed on purpose")
        return ProfileResult((min(scored, key=lambda s: s.score).endpoint,))


class HookedScorer:
    """Scores 0.5 everywhere; its hooks record calls, and raise when ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False
        self.pre: list[str] = []
        self.post: list[str] = []
        self.pools: list[frozenset[str]] = []

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return [0.5] * len(endpoints)

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        if self.fail:
            raise RuntimeError("pre_request failed")
        self.pre.append(result.targets[0].key)

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None:
        if self.fail:
            raise RuntimeError("post_response failed")
        self.post.append(info.endpoint_key)

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        self.pools.append(keys)


class KwargsScorer:
    """A constructor taking ``**kwargs`` gets name, params and ctx."""

    Params = TenantParams

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return [0.0] * len(endpoints)


# -- protocol violations, one each ------------------------------------------------------------------------


def not_a_class(req: InferenceRequest) -> float:
    return 0.0


class NoRole:
    def rate(self, req: InferenceRequest) -> float:
        return 0.0


class TwoRoles:
    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return []

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        return endpoints


class ShortScore:
    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint]) -> Scores:
        return []


class NeedsSize:
    def __init__(self, size: int) -> None:
        self.size = size

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return []


class IntParams:
    def __init__(self, params: int) -> None:
        self.params = params

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return []


class UnannotatedParams:
    def __init__(self, params) -> None:  # type: ignore[no-untyped-def]
        self.params = params

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return []


class StringCategory:
    category = "affinity"

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return []


class RaisesInInit:
    def __init__(self) -> None:
        raise RuntimeError("no GPU here")

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        return []


class Handler:
    def pick_profiles(self, *args: object) -> Sequence[str]:
        return ()
