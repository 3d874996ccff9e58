"""Flow-control policy types: accepted in a config, parameters typed and kept for admission.

Declared in ``plugins[]`` and named by the ``flowControl`` section (``fairnessPolicyRef``, ``orderingPolicyRef``,
``usageLimitPolicyPluginRef``); ``picker.admission.flowconfig`` reads them (scheduling.md §9).

* ``global-strict-fairness-policy`` (default): within a priority band the flow whose next request is first by
  the ordering policy goes first (one queue across flows).
* ``round-robin-fairness-policy``: flows of a band take turns, one dispatch each; a flooding flow cannot starve
  the others.
* ``fcfs-ordering-policy`` (default): a flow's requests leave in arrival order.
* ``edf-ordering-policy``: earliest deadline (arrival + TTL) first; requests without a TTL after them, by arrival.
* ``slo-deadline-ordering-policy`` (llm-d's): earliest SLO deadline first, arrival + the request's TTFT objective
  (``x-llm-d-slo-ttft-ms``, or ``x-slo-ttft-ms``); requests without one after them, by arrival.
* ``static-usage-limit-policy``: the saturation ceiling above which nothing is dispatched, ``threshold`` 1.0.

No other parameters.
"""

from __future__ import annotations

from pydantic import Field

from picker.plugins import PluginContext, PluginParams
from picker.scheduling.spec import ConfiguredPlugin, PluginSpec

__all__ = [
    "EDF",
    "EDF_SPEC",
    "FAIRNESS",
    "FCFS",
    "FCFS_SPEC",
    "GLOBAL_STRICT",
    "ORDERING",
    "ROUND_ROBIN",
    "ROUND_ROBIN_SPEC",
    "SLO_DEADLINE",
    "SLO_DEADLINE_SPEC",
    "SPEC",
    "STATIC_USAGE_LIMIT",
    "STATIC_USAGE_LIMIT_SPEC",
    "TYPE",
    "USAGE_LIMIT",
    "Params",
    "UsageLimitParams",
]

GLOBAL_STRICT = "global-strict-fairness-policy"
ROUND_ROBIN = "round-robin-fairness-policy"
FCFS = "fcfs-ordering-policy"
EDF = "edf-ordering-policy"
SLO_DEADLINE = "slo-deadline-ordering-policy"
STATIC_USAGE_LIMIT = "static-usage-limit-policy"
TYPE = GLOBAL_STRICT

FAIRNESS, ORDERING, USAGE_LIMIT = "fairness-policy", "ordering-policy", "usage-limit-policy"


class Params(PluginParams):
    """No parameters."""


class UsageLimitParams(PluginParams):
    threshold: float = Field(default=1.0, gt=0.0)


def _policy(type_name: str, kind: str) -> PluginSpec[Params]:
    def create(name: str, params: Params, ctx: PluginContext) -> ConfiguredPlugin:
        return ConfiguredPlugin(type_name, name, params, kind)

    return PluginSpec(type_name, Params, create, kind=kind)


def _usage_limit(name: str, params: UsageLimitParams, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(STATIC_USAGE_LIMIT, name, params, USAGE_LIMIT)


SPEC = _policy(GLOBAL_STRICT, FAIRNESS)
ROUND_ROBIN_SPEC = _policy(ROUND_ROBIN, FAIRNESS)
FCFS_SPEC = _policy(FCFS, ORDERING)
EDF_SPEC = _policy(EDF, ORDERING)
SLO_DEADLINE_SPEC = _policy(SLO_DEADLINE, ORDERING)
STATIC_USAGE_LIMIT_SPEC = PluginSpec(STATIC_USAGE_LIMIT, UsageLimitParams, _usage_limit, kind=USAGE_LIMIT)
