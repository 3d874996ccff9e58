"""by-label (deprecated llm-d filter): keep the endpoints whose label has one of the listed values.

Type ``by-label``. Input: each candidate's labels. Keeps an endpoint whose label ``label`` is one of
``validValues``, or that lacks the label when ``allowsNoLabel`` is true. Prefer ``label-selector-filter``.

Parameters: ``label`` ""; ``validValues`` []; ``allowsNoLabel`` false.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Filter
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "ByLabelFilter", "Params", "create"]

TYPE = "by-label"


class Params(PluginParams):
    label: str = ""
    valid_values: tuple[str, ...] = ()
    allows_no_label: bool = False


class ByLabelFilter:
    type: ClassVar[str] = TYPE
    __slots__ = ("_allow_missing", "_label", "_values", "name")

    def __init__(self, name: str, label: str, valid_values: Sequence[str], *, allows_no_label: bool = False) -> None:
        self.name = name
        self._label = label
        self._values = frozenset(valid_values)
        self._allow_missing = allows_no_label

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        label, values, allow_missing = self._label, self._values, self._allow_missing
        kept: list[Endpoint] = []
        for e in endpoints:
            value = e.labels.get(label)
            if value in values if value is not None else allow_missing:
                kept.append(e)
        return kept


def create(name: str, params: Params, ctx: PluginContext) -> Filter:
    return ByLabelFilter(name, params.label, params.valid_values, allows_no_label=params.allows_no_label)


SPEC = PluginSpec(TYPE, Params, create)
