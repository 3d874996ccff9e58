"""PolicyResolver: applies the pool's InferenceObjective priorities and InferenceModelRewrites to a request.

The director calls it after the rewrite header (``x-gateway-model-name-rewrite``), which wins over a rewrite rule.
"""

from __future__ import annotations

import dataclasses
import random

from picker.endpoints.policy import PolicyStore, priority_for, resolve_rewrite
from picker.request import rewrite
from picker.request.model import InferenceRequest
from picker.telemetry import metrics

__all__ = ["PolicyResolver"]


class PolicyResolver:
    def __init__(self, policies: PolicyStore, rng: random.Random | None = None) -> None:
        self._policies = policies
        self._rng = rng or random.Random()

    def __call__(self, req: InferenceRequest) -> InferenceRequest:
        policy = self._policies.current()
        priority = priority_for(policy, req.objective)  # unknown or unset ⇒ 0
        if priority != req.priority:
            req = dataclasses.replace(req, priority=priority)
        if req.target_model == req.model and req.model:  # the rewrite header did not already win
            target, rule = resolve_rewrite(policy, req.model, self._rng)
            if rule is not None and target != req.model:
                metrics.MODEL_REWRITE_DECISIONS.labels(rule, req.model, target).inc()
                req = rewrite.rewrite_model(req, target)
        return req
