"""KubeSettings and the ``picker serve`` flags of Kubernetes discovery and leader election.

Kept apart from ``kubernetes.py`` so that parsing flags never imports kubernetes-asyncio: ``picker serve
--endpoints ...`` runs without it installed, and ``picker.discovery.kubernetes`` is imported only when a pool or a
selector is given.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from picker.discovery import kubeobjects
from picker.discovery.kubeobjects import POOL_GROUP, POOL_GROUP_V1ALPHA2, Selector
from picker.errors import ConfigError
from picker.scheduling.units import add_bool_flag, duration_arg

__all__ = ["KubeSettings", "configure", "settings_from_args"]

_JITTER_FACTOR = 1.2  # client-go's leader election jitter of the retry period
_CRD_RECHECK_S = 60.0


@dataclass(frozen=True, slots=True)
class KubeSettings:
    pool_name: str = ""  # pool mode when set
    pool_namespace: str = "default"  # also the namespace of the pods, objectives and rewrites
    pool_group: str = POOL_GROUP  # or the v1alpha2 group inference.networking.x-k8s.io
    endpoint_selector: Selector = ()  # standalone mode when set: sorted (key, value) pairs
    target_ports: tuple[int, ...] = ()  # standalone mode: ranks in this order
    kubeconfig: str | None = None
    in_cluster: bool | None = None  # None: in-cluster when no kubeconfig is given and KUBERNETES_SERVICE_HOST is set
    api_server: str | None = None  # plain http(s) URL, no auth (tests, `kubectl proxy`); overrides the above
    resync_s: float = 300.0  # full relist this often, whatever happened
    watch_timeout_s: float = 300.0  # watch timeoutSeconds, each drawn in [t, 2t)
    request_timeout_s: float = 30.0  # list requests, watch connects
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 4.0  # also how long an API outage can hide a change once the API is back
    crd_recheck_s: float = _CRD_RECHECK_S  # how often an absent CRD (404) is looked for again
    # Leader election (--ha-enable-leader-election): controller-runtime's defaults.
    leader_election: bool = False
    lease_duration_s: float = 15.0  # a standby takes over a lease not renewed for this long
    renew_deadline_s: float = 10.0  # the leader steps down when it could not renew for this long
    retry_period_s: float = 2.0  # renew (leader) and acquire (standby) attempts this often
    identity: str = ""  # the Lease holder; "" = $POD_NAME, else <hostname>_<random>

    @property
    def standalone(self) -> bool:
        return bool(self.endpoint_selector)

    @property
    def pool_version(self) -> str:
        return "v1" if self.pool_group == POOL_GROUP else "v1alpha2"

    def validate(self) -> None:
        if bool(self.pool_name) == self.standalone:
            raise ConfigError("give exactly one of --pool-name and --endpoint-selector")
        if self.standalone and not self.target_ports:
            raise ConfigError("--endpoint-selector needs --endpoint-target-ports")
        if self.pool_name and self.target_ports:
            raise ConfigError("--endpoint-target-ports is for standalone mode; the pool names its own ports")
        if self.pool_group not in (POOL_GROUP, POOL_GROUP_V1ALPHA2):
            raise ConfigError(f"--pool-group must be {POOL_GROUP} or {POOL_GROUP_V1ALPHA2}, not {self.pool_group!r}")
        if min(self.resync_s, self.watch_timeout_s, self.request_timeout_s, self.crd_recheck_s) <= 0:
            raise ConfigError("kubernetes timings must be positive")
        if self.leader_election:
            if not self.pool_name:
                raise ConfigError("--ha-enable-leader-election needs --pool-name: the Lease is named after the pool")
            # client-go's rules: the leader gives up before others may take over, and retries within its deadline.
            if not self.lease_duration_s > self.renew_deadline_s > _JITTER_FACTOR * self.retry_period_s > 0:
                raise ConfigError(
                    "leader election timings need lease duration > renew deadline > 1.2 x retry period > 0"
                )


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the discovery flags (reference EPP names) to ``picker serve``'s parser."""
    group = parser.add_argument_group("kubernetes: discovery and leader election")
    group.add_argument("--pool-name", default="", help="InferencePool to serve (pool mode)")
    group.add_argument(
        "--pool-namespace", default=None, help="namespace of the pool (default: $NAMESPACE, else default)"
    )
    group.add_argument(
        "--pool-group", default=POOL_GROUP, help=f"API group of the InferencePool (default {POOL_GROUP})"
    )
    group.add_argument("--endpoint-selector", default="", help="standalone mode: pod label selector 'k=v,k2=v2'")
    group.add_argument("--endpoint-target-ports", default="", help="standalone mode: ports per pod, e.g. 8000,8001")
    group.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, else ~/.kube/config)")
    group.add_argument(
        "--crd-recheck-interval",
        type=duration_arg,
        default=_CRD_RECHECK_S,
        metavar="DURATION",
        help="how often an optional CRD that is not installed (InferenceObjective, InferenceModelRewrite) is looked "
        "for again (default 60s)",
    )
    add_bool_flag(
        group,
        "--ha-enable-leader-election",
        default=False,
        help="active-passive replicas: only the holder of the pool's Lease reports ready (needs --pool-name)",
    )


def settings_from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> KubeSettings | None:
    """KubeSettings from the flags of ``configure``; None when neither a pool nor a selector is given."""
    env = os.environ if environ is None else environ
    if not args.pool_name and not args.endpoint_selector:
        if args.endpoint_target_ports:
            raise ConfigError("--endpoint-target-ports needs --endpoint-selector")
        if args.ha_enable_leader_election:
            raise ConfigError("--ha-enable-leader-election needs --pool-name: the Lease is named after the pool")
        return None
    settings = KubeSettings(
        pool_name=args.pool_name,
        pool_namespace=args.pool_namespace or env.get("NAMESPACE") or "default",
        pool_group=args.pool_group,
        endpoint_selector=kubeobjects.parse_selector(args.endpoint_selector) if args.endpoint_selector else (),
        target_ports=kubeobjects.parse_ports(args.endpoint_target_ports) if args.endpoint_target_ports else (),
        kubeconfig=args.kubeconfig,
        crd_recheck_s=args.crd_recheck_interval,
        leader_election=args.ha_enable_leader_election,
        identity=env.get("POD_NAME", ""),
    )
    settings.validate()
    return settings
