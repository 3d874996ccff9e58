"""The Kubernetes permissions picker needs, declared once.

The Helm chart's Role (deploy/helm/picker/templates/rbac.yaml) must grant exactly these; tests/deploy checks the
rendered Role against ``rules_for`` for each chart setting, and tests/discovery check that every call discovery and
leader election make (against the stand-in API server) is covered, so a new call cannot ship without its rule.

The InferencePool rule follows the pool's API group (``--pool-group``): ``inference.networking.k8s.io`` (v1, the
default) or the older ``inference.networking.x-k8s.io`` (v1alpha2). Only the group in use is granted, as the
reference chart does (it derives the group from ``inferencePool.apiVersion``).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "INFERENCE_GROUP",
    "INFERENCE_X_GROUP",
    "LEADER_ELECTION_RULES",
    "LLMD_GROUP",
    "METRICS_AUTH_RULES",
    "PEER_RULES",
    "POLICY_GROUPS",
    "REQUIRED_RULES",
    "PolicyRule",
    "pool_rule",
    "rules_for",
]

INFERENCE_GROUP = "inference.networking.k8s.io"  # InferencePool v1
INFERENCE_X_GROUP = "inference.networking.x-k8s.io"  # InferenceObjective, InferenceModelRewrite v1alpha2
LLMD_GROUP = "llm-d.ai"  # InferenceObjective, InferenceModelRewrite v1alpha2, where upstream moved them
POLICY_GROUPS = (INFERENCE_X_GROUP, LLMD_GROUP)  # picker reads the objectives and rewrites of both

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


def pool_rule(pool_group: str = INFERENCE_GROUP) -> PolicyRule:
    """Read access to InferencePools of ``pool_group``."""
    if pool_group not in (INFERENCE_GROUP, INFERENCE_X_GROUP):
        raise ValueError(f"unknown InferencePool group {pool_group!r}")
    return PolicyRule(pool_group, "inferencepools", _READ)


# Pool mode (--pool-name) with a v1 pool: read the pool, its pods, and the optional objective/rewrite CRDs of
# both groups.
REQUIRED_RULES: tuple[PolicyRule, ...] = (
    PolicyRule("", "pods", _READ),
    pool_rule(INFERENCE_GROUP),
    *(PolicyRule(g, p, _READ) for g in POLICY_GROUPS for p in ("inferenceobjectives", "inferencemodelrewrites")),
)

# Added with --ha-enable-leader-election: the Lease it holds and the events the election records. picker itself
# calls get/create/update (and list/watch, to hear of a release at once) on its Lease and create on events; the
# rest are the verbs the reference grants, kept so either EPP runs under the same Role.
LEADER_ELECTION_RULES: tuple[PolicyRule, ...] = (
    PolicyRule("coordination.k8s.io", "leases", ("get", "list", "watch", "create", "update", "patch", "delete")),
    PolicyRule("", "events", ("create", "patch")),
)


# Added with --metrics-endpoint-auth, in a ClusterRole (reviews are cluster-scoped): tokenreview.py creates a
# TokenReview and a SubjectAccessReview per scrape token (cached), nothing else.
METRICS_AUTH_RULES: tuple[PolicyRule, ...] = (
    PolicyRule("authentication.k8s.io", "tokenreviews", ("create",)),
    PolicyRule("authorization.k8s.io", "subjectaccessreviews", ("create",)),
)


# Added with --peer-service (active-active replicas, docs/ha.md): the EndpointSlices of picker's own Service.
PEER_RULES: tuple[PolicyRule, ...] = (PolicyRule("discovery.k8s.io", "endpointslices", _READ),)


def rules_for(
    *, leader_election: bool, pool_group: str = INFERENCE_GROUP, peers: bool = False
) -> tuple[PolicyRule, ...]:
    """Every rule picker needs in pool mode for a pool of ``pool_group``, with or without leader election, and
    with or without peer discovery through EndpointSlices."""
    rules = tuple(pool_rule(pool_group) if r.resource == "inferencepools" else r for r in REQUIRED_RULES)
    return rules + (LEADER_ELECTION_RULES if leader_election else ()) + (PEER_RULES if peers else ())
