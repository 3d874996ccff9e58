"""The offline schema maker: self-contained files with exactly the definitions each kind reaches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from . import kube_schemas
from ._tools import KUBE_SCHEMAS

DEFINITIONS: dict[str, Any] = {
    "Spec": {"type": "object", "properties": {"meta": {"$ref": "#/$defs/Meta"}}},
    "Meta": {"type": "object", "properties": {"labels": {"$ref": "#/$defs/Labels"}}},
    "Labels": {"type": "object", "additionalProperties": {"type": "string"}},
    "Unused": {"type": "string"},
    "Self": {"type": "object", "properties": {"child": {"$ref": "#/$defs/Self"}}},
}


def test_standalone_embeds_the_transitive_closure_only() -> None:
    kind = {
        "$id": "https://kubernetes.io/api/thing/v1",
        "properties": {"spec": {"$ref": "/api/_definitions.json#/$defs/Spec"}},
    }
    out = kube_schemas.standalone(kind, DEFINITIONS)
    assert "$id" not in out
    assert out["properties"]["spec"] == {"$ref": "#/$defs/Spec"}
    assert set(out["$defs"]) == {"Spec", "Meta", "Labels"}
    assert out["$defs"]["Spec"]["properties"]["meta"] == {"$ref": "#/$defs/Meta"}


def test_standalone_handles_recursive_definitions() -> None:
    out = kube_schemas.standalone({"$ref": "/api/_definitions.json#/$defs/Self"}, DEFINITIONS)
    assert set(out["$defs"]) == {"Self"}


def test_unknown_reference_form_is_an_error() -> None:
    with pytest.raises(ValueError, match="unexpected"):
        kube_schemas.standalone({"$ref": "https://elsewhere/x.json"}, DEFINITIONS)


def test_generate_writes_the_kubeconform_layout(tmp_path: Path) -> None:
    src = tmp_path / "src" / "v9.9.9-local-strict"
    src.mkdir(parents=True)
    (src / "_definitions.json").write_text(json.dumps({"$defs": DEFINITIONS}))
    for kind in kube_schemas.KINDS:
        (src / f"{kind}.json").write_text(json.dumps({"$ref": "/api/_definitions.json#/$defs/Spec"}))
    written = kube_schemas.generate(tmp_path / "src", tmp_path / "out", "v9.9.9")
    assert [p.name for p in written] == [f"{k}.json" for k in kube_schemas.KINDS]
    assert all(p.parent == tmp_path / "out" / "v9.9.9-standalone-strict" for p in written)
    with pytest.raises(FileNotFoundError):
        kube_schemas.generate(tmp_path / "src", tmp_path / "out", "v0.0.1")


def test_installed_schemas_are_self_contained() -> None:
    if not KUBE_SCHEMAS.is_dir():
        pytest.fail(f"{KUBE_SCHEMAS} is missing: run `bash scripts/install-tools.sh`")
    deployment = json.loads((KUBE_SCHEMAS / "deployment-apps-v1.json").read_text())
    text = json.dumps(deployment)
    assert "_definitions.json" not in text
    assert "$id" not in deployment
    assert "io.k8s.api.core.v1.Probe" in deployment["$defs"]
    assert deployment["additionalProperties"] is False  # the strict variant
