"""label-selector-filter (alias by-label-selector): keep the endpoints whose labels match a Kubernetes selector.

Type ``label-selector-filter``; ``by-label-selector`` is the same filter under llm-d's older name. Input: each
candidate's labels (its pod's labels). The parameters *are* a ``metav1.LabelSelector``: ``matchLabels`` (every
key must have exactly that value) AND ``matchExpressions`` (each ``{key, operator, values}``):

* ``In``: the label is present with one of ``values``; ``NotIn``: absent, or present with none of ``values``;
* ``Exists`` / ``DoesNotExist``: the key is present / absent (``values`` must be empty).

An empty selector keeps every endpoint. Unknown operators, and ``In``/``NotIn`` without values, are
configuration errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import model_validator

from picker.plugins import CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Filter
from picker.scheduling.spec import PluginSpec

__all__ = [
    "BY_LABEL_SELECTOR",
    "BY_LABEL_SELECTOR_SPEC",
    "SPEC",
    "TYPE",
    "LabelSelectorFilter",
    "Params",
    "Requirement",
    "create",
    "matches",
]

TYPE = "label-selector-filter"
BY_LABEL_SELECTOR = "by-label-selector"


class Requirement(PluginParams):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _values_fit_operator(self) -> Requirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class Params(PluginParams):
    match_labels: dict[str, str] = {}
    match_expressions: tuple[Requirement, ...] = ()


def matches(labels: Mapping[str, str], params: Params) -> bool:
    """Whether ``labels`` satisfy the selector."""
    for key, wanted in params.match_labels.items():
        if labels.get(key) != wanted:
            return False
    for req in params.match_expressions:
        value = labels.get(req.key)
        op = req.operator
        if op == "In":
            ok = value is not None and value in req.values
        elif op == "NotIn":
            ok = value is None or value not in req.values
        elif op == "Exists":
            ok = value is not None
        else:
            ok = value is None
        if not ok:
            return False
    return True


class LabelSelectorFilter:
    __slots__ = ("_params", "name", "type")

    def __init__(self, name: str, params: Params, type_name: str = TYPE) -> None:
        self.name = name
        self.type = type_name
        self._params = params

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        params = self._params
        if not params.match_labels and not params.match_expressions:
            return endpoints
        return [e for e in endpoints if matches(e.labels, params)]


def create(name: str, params: Params, ctx: PluginContext) -> Filter:
    return LabelSelectorFilter(name, params)


def _create_alias(name: str, params: Params, ctx: PluginContext) -> Filter:
    return LabelSelectorFilter(name, params, BY_LABEL_SELECTOR)


SPEC = PluginSpec(TYPE, Params, create)
BY_LABEL_SELECTOR_SPEC = PluginSpec(BY_LABEL_SELECTOR, Params, _create_alias)
