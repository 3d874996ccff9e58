"""The Kubernetes permissions picker needs, declared once.

The Helm chart's Role (deploy/helm/picker/templates/rbac.yaml) must grant exactly these; tests/deploy checks the
rendered Role against this module, and the discovery code reads the API groups and resources it watches from here,
so a new watch cannot ship without its RBAC rule.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "INFERENCE_GROUP",
    "INFERENCE_X_GROUP",
    "LEADER_ELECTION_RULES",
    "REQUIRED_RULES",
    "PolicyRule",
    "rules_for",
]

INFERENCE_GROUP = "inference.networking.k8s.io"  # InferencePool v1
INFERENCE_X_GROUP = "inference.networking.x-k8s.io"  # InferenceObjective, InferenceModelRewrite v1alpha2

_READ = ("get", "watch", "list")


@dataclass(frozen=True, slots=True)
class PolicyRule:
    """One RBAC rule: verbs on one resource of one API group ("" is the core group)."""

    api_group: str
    resource: str
    verbs: tuple[str, ...]

    def key(self) -> tuple[str, str, frozenset[str]]:
        """Order-free identity, for comparing with rendered Role rules."""
        return (self.api_group, self.resource, frozenset(self.verbs))


# Pool mode (--pool-name): read the pool, its pods, and the optional objective/rewrite CRDs.
REQUIRED_RULES: tuple[PolicyRule, ...] = (
    PolicyRule("", "pods", _READ),
    PolicyRule(INFERENCE_GROUP, "inferencepools", _READ),
    PolicyRule(INFERENCE_X_GROUP, "inferenceobjectives", _READ),
    PolicyRule(INFERENCE_X_GROUP, "inferencemodelrewrites", _READ),
)

# Added with --ha-enable-leader-election: the Lease it holds and the events the election records.
LEADER_ELECTION_RULES: tuple[PolicyRule, ...] = (
    PolicyRule("coordination.k8s.io", "leases", ("get", "list", "watch", "create", "update", "patch", "delete")),
    PolicyRule("", "events", ("create", "patch")),
)


def rules_for(*, leader_election: bool) -> tuple[PolicyRule, ...]:
    """Every rule picker needs in pool mode, with or without leader election."""
    return REQUIRED_RULES + (LEADER_ELECTION_RULES if leader_election else ())
