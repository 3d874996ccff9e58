"""Pool policy: InferenceObjective priorities and InferenceModelRewrite rules as pure values (no I/O).

Discovery (``picker.discovery.kubernetes``) builds a ``PoolPolicy`` from the custom resources that reference our
InferencePool and publishes it to a ``PolicyStore``; the request path reads ``PolicyStore.current()`` and calls
``priority_for`` and ``resolve_rewrite``.

Rewrite precedence (protocol.md §11, the reference EPP's ``modelRewriteStore.getRule``): a rule that names the
request's model exactly beats a generic rule (one with no ``matches``); among equals the rule of the oldest
InferenceModelRewrite (``metadata.creationTimestamp``) wins, then the lower object name, then the earlier rule in
the object. The target is drawn weighted at random in ``[0, Σweight)``; when every weight is 0 (weights unset) the
draw is uniform.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = [
    "PolicyListener",
    "PolicyStore",
    "PoolPolicy",
    "RewriteRule",
    "RewriteTarget",
    "pick_target",
    "policy_of",
    "priority_for",
    "resolve_rewrite",
]

_NO_OBJECTIVES: Mapping[str, int | None] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RewriteTarget:
    model: str  # spec.rules[].targets[].modelRewrite
    weight: int = 0  # 0 = unset; a rule's targets either all set weights (1..1e6) or none do


@dataclass(frozen=True, slots=True)
class RewriteRule:
    """One ``spec.rules[]`` entry of an InferenceModelRewrite, with what ordering needs from its object."""

    rewrite_name: str  # metadata.name of the InferenceModelRewrite: the "rule name" reported on a rewrite
    created_at: float  # metadata.creationTimestamp, seconds since the epoch
    index: int  # position of the rule in spec.rules
    models: frozenset[str]  # exact model names matched (any of them); empty = generic, matches every model
    targets: tuple[RewriteTarget, ...]

    @property
    def generic(self) -> bool:
        return not self.models

    def sort_key(self) -> tuple[float, str, int]:
        return (self.created_at, self.rewrite_name, self.index)


@dataclass(frozen=True, slots=True)
class PoolPolicy:
    """Objective priorities and rewrite rules of one pool at one moment. Published whole; never mutated."""

    # InferenceObjective metadata.name -> spec.priority (None: unset, treated as 0)
    objectives: Mapping[str, int | None] = field(default_factory=lambda: _NO_OBJECTIVES)
    rewrites: tuple[RewriteRule, ...] = ()  # kept in precedence order (see module docstring)
    _exact: Mapping[str, RewriteRule] = field(default_factory=dict, init=False, compare=False, repr=False)
    _generic: RewriteRule | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Rules without targets cannot rewrite anything; they neither match nor shadow another rule.
        rules = tuple(sorted((r for r in self.rewrites if r.targets), key=RewriteRule.sort_key))
        exact: dict[str, RewriteRule] = {}
        generic: RewriteRule | None = None
        for rule in rules:
            if rule.generic and generic is None:
                generic = rule
            for model in rule.models:
                exact.setdefault(model, rule)
        object.__setattr__(self, "rewrites", rules)
        object.__setattr__(self, "objectives", MappingProxyType(dict(self.objectives)))
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_generic", generic)

    def rule_for(self, model: str) -> RewriteRule | None:
        """The rule that applies to ``model``: its oldest exact rule, else the oldest generic rule, else None."""
        return self._exact.get(model) or self._generic


def priority_for(policy: PoolPolicy, objective_name: str | None) -> int:
    """Priority of the named InferenceObjective; unknown, unnamed or unset ⇒ 0. Negative ⇒ sheddable."""
    if not objective_name:
        return 0
    priority = policy.objectives.get(objective_name)
    return 0 if priority is None else priority


def resolve_rewrite(policy: PoolPolicy, model: str, rng: random.Random) -> tuple[str, str | None]:
    """``(target model, InferenceModelRewrite name)`` for a request's model; ``(model, None)`` when no rule applies."""
    rule = policy.rule_for(model)
    if rule is None:
        return model, None
    return pick_target(rule.targets, rng), rule.rewrite_name


def pick_target(targets: tuple[RewriteTarget, ...], rng: random.Random) -> str:
    """Weighted random target: a draw in ``[0, Σweight)``; all weights 0 ⇒ uniform."""
    if len(targets) == 1:
        return targets[0].model
    total = sum(max(0, t.weight) for t in targets)
    if total <= 0:
        return targets[rng.randrange(len(targets))].model
    draw = rng.randrange(total)
    for target in targets:
        draw -= max(0, target.weight)
        if draw < 0:
            return target.model
    return targets[-1].model  # unreachable: the draw is below the total


PolicyListener = Callable[[PoolPolicy], None]


class PolicyStore:
    """Holds the current PoolPolicy; discovery publishes, the request path reads ``current()``."""

    def __init__(self, initial: PoolPolicy | None = None) -> None:
        self._policy = initial or PoolPolicy()
        self._listeners: list[PolicyListener] = []

    def current(self) -> PoolPolicy:
        return self._policy

    def subscribe(self, listener: PolicyListener) -> None:
        """Call ``listener`` with every newly published policy."""
        self._listeners.append(listener)

    def publish(self, policy: PoolPolicy) -> bool:
        """Make ``policy`` current; False (and no listener call) when it equals the current one."""
        if policy == self._policy:
            return False
        self._policy = policy
        for listener in self._listeners:
            listener(policy)
        return True


def policy_of(objectives: Mapping[str, int | None], rules: Iterable[RewriteRule]) -> PoolPolicy:
    """Convenience constructor from any mapping and iterable of rules."""
    return PoolPolicy(objectives=dict(objectives), rewrites=tuple(rules))
