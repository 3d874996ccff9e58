"""Builders of the Kubernetes objects the discovery tests store in the stand-in API server, and ``eventually``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any

Obj = dict[str, Any]

POOL_GROUP = "inference.networking.k8s.io"


def pod(
    name: str,
    ip: str | None = "10.0.0.1",
    *,
    ready: bool = True,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    deleting: bool = False,
    namespace: str = "default",
) -> Obj:
    meta: Obj = {"name": name, "namespace": namespace, "labels": dict(labels or {"app": "vllm"})}
    if annotations:
        meta["annotations"] = dict(annotations)
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    status: Obj = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": meta, "spec": {"containers": [{"name": "vllm"}]}, "status": status}


def pool(
    name: str = "pool",
    *,
    selector: Mapping[str, str] | None = None,
    ports: Sequence[int] = (8000,),
    app_protocol: str | None = None,
    namespace: str = "default",
) -> Obj:
    spec: Obj = {
        "selector": {"matchLabels": dict(selector or {"app": "vllm"})},
        "targetPorts": [{"number": p} for p in ports],
        "endpointPickerRef": {"name": "picker", "port": {"number": 9002}},
    }
    if app_protocol:
        spec["appProtocol"] = app_protocol
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec}


def pool_ref(name: str = "pool") -> Obj:
    return {"group": POOL_GROUP, "kind": "InferencePool", "name": name}


def objective(name: str, priority: int | None = None, *, pool_name: str = "pool") -> Obj:
    spec: Obj = {"poolRef": pool_ref(pool_name)}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name}, "spec": spec}


def rewrite(
    name: str,
    rules: Sequence[tuple[Sequence[str], Sequence[tuple[str, int]]]],
    *,
    created: str = "2025-01-01T00:00:00Z",
    pool_name: str = "pool",
) -> Obj:
    """``rules``: (exact models, [(target model, weight)]) per rule; weight 0 = unset."""
    spec_rules = []
    for models, targets in rules:
        rule: Obj = {"targets": [{"modelRewrite": m, **({"weight": w} if w else {})} for m, w in targets]}
        if models:
            rule["matches"] = [{"model": {"type": "Exact", "value": m}} for m in models]
        spec_rules.append(rule)
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        "spec": {"poolRef": pool_ref(pool_name), "rules": spec_rules},
    }


async def eventually(predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Wait (polling every 10 ms) until ``predicate()`` holds; fail the test after ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            while not predicate():  # noqa: ASYNC110 - the state lives in other tasks; no event to wait on
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"{what} did not happen within {timeout_s}s") from None
