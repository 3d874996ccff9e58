"""label-affinity-scorer: prefer endpoints whose label matches a request header (e.g. a tenant's own pods)."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, Scores


@dataclass(frozen=True)
class LabelAffinityParams:
    header: str = "x-affinity"  # the request header naming what the request wants
    label: str = "affinity"  # the endpoint label compared with it


class LabelAffinityScorer:
    """1.0 where the endpoint's label equals the header's value, else 0.0; no header: 0.0 everywhere."""

    category: ClassVar[Category] = Category.AFFINITY

    def __init__(self, params: LabelAffinityParams) -> None:
        self.header = params.header.lower()  # picker lower-cases request header names
        self.label = params.label

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
        wanted = req.headers.get(self.header)
        return [1.0 if wanted is not None and e.labels.get(self.label) == wanted else 0.0 for e in endpoints]
