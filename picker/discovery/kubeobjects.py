"""Kubernetes objects (decoded JSON) → picker values. Pure functions: no I/O, no client library.

- InferencePool → ``PoolSpec`` (selector, target ports, appProtocol); v1 (``inference.networking.k8s.io``) and the
  older v1alpha2 shape (``inference.networking.x-k8s.io``: flat ``selector`` map, one ``targetPortNumber``).
- Pod x target port → ``Endpoint`` named ``<pod>-rank-<idx>`` (idx: the port's position in ``targetPorts``), for
  ready pods only: no ``deletionTimestamp``, condition ``Ready=True``, a ``podIP``. The annotation
  ``inference.networking.k8s.io/active-ports: "8000,8001"`` (or its successor ``llm-d.ai/active-ports``) limits
  the ranks to the listed ports; without it every target port is active.
- InferenceObjective / InferenceModelRewrite (v1alpha2, ``llm-d.ai`` or ``inference.networking.x-k8s.io``) whose
  ``spec.poolRef`` names our pool → ``PoolPolicy``.

Malformed fields never raise out of here: a pod or rule that cannot be read is skipped, and a pool that cannot be
read is reported as ``InvalidPool`` for the caller to log.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from picker.discovery import rbac
from picker.endpoints.model import Endpoint
from picker.endpoints.policy import PoolPolicy, RewriteRule, RewriteTarget
from picker.errors import ConfigError

__all__ = [
    "ACTIVE_PORTS_ANNOTATION",
    "ENGINE_LABEL",
    "POOL_GROUP",
    "POOL_GROUP_V1ALPHA2",
    "InvalidPool",
    "PodEndpoints",
    "PoolSpec",
    "build_policy",
    "endpoints_for",
    "format_selector",
    "parse_pool",
    "parse_ports",
    "parse_selector",
    "parse_timestamp",
    "pod_endpoints",
    "pod_is_ready",
    "pool_ref_matches",
]

POOL_GROUP = rbac.INFERENCE_GROUP  # InferencePool v1
POOL_GROUP_V1ALPHA2 = rbac.INFERENCE_X_GROUP  # InferencePool v1alpha2; InferenceObjective, InferenceModelRewrite
ENGINE_LABEL = "inference.networking.k8s.io/engine-type"
ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports"
_ACTIVE_PORTS_SUCCESSOR = "llm-d.ai/active-ports"
SUPPORTED_APP_PROTOCOLS = frozenset({"http", "kubernetes.io/h2c"})
MAX_TARGET_PORTS = 8

Selector = tuple[tuple[str, str], ...]  # sorted (key, value) pairs, ANDed

# Label key: optional DNS-subdomain prefix and "/", then a name; a value: empty or a name (Kubernetes rules).
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_LABEL_NAME})?$")


class InvalidPool(ValueError):
    """The InferencePool object cannot be used (no selector, no valid port, ...)."""


@dataclass(frozen=True, slots=True)
class PoolSpec:
    selector: Selector
    target_ports: tuple[int, ...]
    app_protocol: str = "http"

    @property
    def app_protocol_supported(self) -> bool:
        return self.app_protocol in SUPPORTED_APP_PROTOCOLS


# --- flags -------------------------------------------------------------------------------------------------


def parse_selector(text: str) -> Selector:
    """``'k=v,k2=v2'`` (``==`` also accepted) → sorted pairs; ConfigError on anything else."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, value = part.partition("==") if "==" in part else part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
            raise ConfigError(f"--endpoint-selector: {part!r} is not key=value with a valid label key and value")
        if pairs.get(key, value) != value:
            raise ConfigError(f"--endpoint-selector: {key!r} given twice with different values")
        pairs[key] = value
    if not pairs:
        raise ConfigError("--endpoint-selector: empty selector (it would match every pod)")
    return tuple(sorted(pairs.items()))


def parse_ports(text: str) -> tuple[int, ...]:
    """``'8000,8001'`` → ports in the given order (their order is the rank index); ConfigError if invalid."""
    ports: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            port = int(part)
        except ValueError:
            raise ConfigError(f"--endpoint-target-ports: {part!r} is not a port number") from None
        if not 1 <= port <= 65535:
            raise ConfigError(f"--endpoint-target-ports: {port} is outside 1..65535")
        if port in ports:
            raise ConfigError(f"--endpoint-target-ports: {port} given twice")
        ports.append(port)
    if not ports:
        raise ConfigError("--endpoint-target-ports: at least one port is required")
    if len(ports) > MAX_TARGET_PORTS:
        raise ConfigError(f"--endpoint-target-ports: at most {MAX_TARGET_PORTS} ports")
    return tuple(ports)


def format_selector(selector: Selector) -> str:
    """The ``labelSelector`` query value for equality-based pairs."""
    return ",".join(f"{k}={v}" for k, v in selector)


# --- InferencePool -----------------------------------------------------------------------------------------


def parse_pool(pool: Mapping[str, Any]) -> PoolSpec:
    """The parts of an InferencePool that discovery needs; InvalidPool when they are unusable."""
    spec = pool.get("spec") or {}
    raw_selector = spec.get("selector") or {}
    # v1: selector is a LabelSelector ({matchLabels: {...}}); v1alpha2: the map itself.
    labels = raw_selector.get("matchLabels") if "matchLabels" in raw_selector else raw_selector
    if raw_selector.get("matchExpressions"):
        raise InvalidPool("selector.matchExpressions is not supported (InferencePool v1 allows matchLabels only)")
    if not isinstance(labels, Mapping) or not labels:
        raise InvalidPool("spec.selector has no labels")
    selector = tuple(sorted((str(k), str(v)) for k, v in labels.items()))
    if "targetPorts" in spec:
        raw_ports = [p.get("number") if isinstance(p, Mapping) else None for p in spec.get("targetPorts") or ()]
    else:
        raw_ports = [spec.get("targetPortNumber")]
    ports: list[int] = []
    for port in raw_ports:
        if isinstance(port, int) and 1 <= port <= 65535 and port not in ports:
            ports.append(port)
    if not ports:
        raise InvalidPool("spec.targetPorts has no valid port")
    return PoolSpec(selector, tuple(ports[:MAX_TARGET_PORTS]), str(spec.get("appProtocol") or "http"))


# --- Pods ----------------------------------------------------------------------------------------------------


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    """Routable: not being deleted, condition Ready=True, and an IP to route to."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    if meta.get("deletionTimestamp") or not status.get("podIP"):
        return False
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _active_ports(annotations: Mapping[str, str], target_ports: Sequence[int]) -> frozenset[int]:
    raw = annotations.get(ACTIVE_PORTS_ANNOTATION)
    if raw is None:
        raw = annotations.get(_ACTIVE_PORTS_SUCCESSOR)
    if raw is None:
        return frozenset(target_ports)
    listed = set()
    for part in str(raw).split(","):
        part = part.strip()
        if part.isdigit():
            listed.add(int(part))
    return frozenset(p for p in target_ports if p in listed)


def pod_endpoints(pod: Mapping[str, Any], target_ports: Sequence[int]) -> tuple[Endpoint, ...]:
    """One endpoint per active target port of a ready pod; none for a pod that is not ready."""
    if not pod_is_ready(pod):
        return ()
    meta = pod.get("metadata") or {}
    name = str(meta.get("name") or "")
    ip = str(pod["status"]["podIP"])
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    engine = labels.get(ENGINE_LABEL) or "vllm"
    active = _active_ports(meta.get("annotations") or {}, target_ports)
    host = f"[{ip}]" if ":" in ip else ip
    return tuple(
        Endpoint.create(
            ip,
            port,
            name=f"{name}-rank-{idx}",
            metrics_url=f"http://{host}:{port}/metrics",
            engine=engine,
            labels=labels,
        )
        for idx, port in enumerate(target_ports)
        if port in active
    )


def _signature(eps: tuple[Endpoint, ...]) -> tuple[tuple[object, ...], ...]:
    return tuple((e.key, e.name, e.metrics_url, e.engine, tuple(sorted(e.labels.items()))) for e in eps)


class PodEndpoints:
    """The endpoints of a pool's pods, kept per pod so one pod's event costs one pod's work.

    ``endpoints()`` orders them by pod name then rank; when two pods claim one ``ip:port`` (a stale pod and its
    replacement) the first by name wins.
    """

    def __init__(self, target_ports: Sequence[int]) -> None:
        self.target_ports = tuple(target_ports)
        self._by_pod: dict[str, tuple[Endpoint, ...]] = {}
        self._signatures: dict[str, tuple[tuple[object, ...], ...]] = {}
        self._assembled: tuple[Endpoint, ...] | None = ()

    def reset(self, pods: Iterable[Mapping[str, Any]]) -> bool:
        """Replace every pod; True if the endpoints changed."""
        by_pod: dict[str, tuple[Endpoint, ...]] = {}
        for pod in pods:
            eps = pod_endpoints(pod, self.target_ports)
            if eps:
                by_pod[str((pod.get("metadata") or {}).get("name") or "")] = eps
        signatures = {name: _signature(eps) for name, eps in by_pod.items()}
        if signatures == self._signatures:
            return False
        self._by_pod, self._signatures, self._assembled = by_pod, signatures, None
        return True

    def update(self, name: str, pod: Mapping[str, Any] | None) -> bool:
        """Set one pod (None: deleted); True if the endpoints changed."""
        eps = pod_endpoints(pod, self.target_ports) if pod is not None else ()
        signature = _signature(eps)
        if signature == self._signatures.get(name, ()):
            return False
        if eps:
            self._by_pod[name], self._signatures[name] = eps, signature
        else:
            self._by_pod.pop(name, None)
            self._signatures.pop(name, None)
        self._assembled = None
        return True

    def endpoints(self) -> tuple[Endpoint, ...]:
        if self._assembled is None:
            by_key: dict[str, Endpoint] = {}
            for name in sorted(self._by_pod):
                for ep in self._by_pod[name]:
                    by_key.setdefault(ep.key, ep)
            self._assembled = tuple(by_key.values())
        return self._assembled


def endpoints_for(pods: Iterable[Mapping[str, Any]], target_ports: Sequence[int]) -> tuple[Endpoint, ...]:
    """Endpoints of all pods, ordered by pod name then rank (see ``PodEndpoints``)."""
    index = PodEndpoints(target_ports)
    index.reset(pods)
    return index.endpoints()


# --- InferenceObjective / InferenceModelRewrite -------------------------------------------------------------


def parse_timestamp(text: object) -> float:
    """RFC 3339 ``creationTimestamp`` → epoch seconds; unreadable ⇒ +inf (sorts as the newest)."""
    if not isinstance(text, str) or not text:
        return float("inf")
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return float("inf")


def pool_ref_matches(obj: Mapping[str, Any], pool_name: str, pool_group: str) -> bool:
    """``spec.poolRef`` names our pool (group and kind may be omitted; if given they must agree)."""
    ref = (obj.get("spec") or {}).get("poolRef") or {}
    if ref.get("name") != pool_name:
        return False
    if ref.get("kind") not in (None, "", "InferencePool"):
        return False
    return ref.get("group") in (None, "", pool_group)


def _priority(objective: Mapping[str, Any]) -> int | None:
    priority = (objective.get("spec") or {}).get("priority")
    return priority if isinstance(priority, int) and not isinstance(priority, bool) else None


def _weight(raw: object) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0 else 0


def _rewrite_rules(rewrite: Mapping[str, Any]) -> list[RewriteRule]:
    meta = rewrite.get("metadata") or {}
    name = str(meta.get("name") or "")
    created_at = parse_timestamp(meta.get("creationTimestamp"))
    rules: list[RewriteRule] = []
    for index, raw in enumerate((rewrite.get("spec") or {}).get("rules") or ()):
        if not isinstance(raw, Mapping):
            continue
        models = set()
        for match in raw.get("matches") or ():
            model = (match or {}).get("model") or {}
            if model.get("type", "Exact") in (None, "Exact") and isinstance(model.get("value"), str):
                models.add(model["value"])
        targets = tuple(
            RewriteTarget(str(t["modelRewrite"]), _weight(t.get("weight")))
            for t in raw.get("targets") or ()
            if isinstance(t, Mapping) and t.get("modelRewrite")
        )
        if raw.get("matches") and not models:
            continue  # only unsupported match types: matching everything instead would be wrong
        rules.append(RewriteRule(name, created_at, index, frozenset(models), targets))
    return rules


def build_policy(
    objectives: Iterable[Mapping[str, Any]],
    rewrites: Iterable[Mapping[str, Any]],
    *,
    pool_name: str,
    pool_group: str,
) -> PoolPolicy:
    """The PoolPolicy of the objectives and rewrites that reference our pool."""
    priorities: dict[str, int | None] = {}
    for objective in objectives:
        if pool_ref_matches(objective, pool_name, pool_group):
            priorities[str((objective.get("metadata") or {}).get("name"))] = _priority(objective)
    rules = [
        rule
        for rewrite in rewrites
        if pool_ref_matches(rewrite, pool_name, pool_group)
        for rule in _rewrite_rules(rewrite)
    ]
    return PoolPolicy(objectives=priorities, rewrites=tuple(rules))
