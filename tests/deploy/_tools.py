"""Runs the real deployment tools (helm, kubeconform, hadolint) that scripts/install-tools.sh puts in .tools/."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "picker"
TOOLS_BIN = REPO / ".tools" / "bin"
KUBE_SCHEMAS = REPO / ".tools" / "kube-schemas" / "v1.34.0-standalone-strict"
CRD_SCHEMAS = Path(__file__).resolve().parent / "schemas"
KUBE_VERSION = "1.34.0"  # helm built by `go install` defaults to 1.20 for `helm template`; say which cluster
NAMESPACE = "llm"
RELEASE = "demo"


def tool(name: str) -> Path:
    """Path of a pinned tool; fails the test (never skips) when it is not installed."""
    path = TOOLS_BIN / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run `bash scripts/install-test.sh` (the test command runs it)")
    return path


def run(args: Iterable[str | Path], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=60, check=False)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(str(a) for a in args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc


@dataclass(frozen=True)
class Rendered:
    """The objects of one `helm template`, in order."""

    text: str
    objects: tuple[dict[str, Any], ...]

    def kinds(self) -> list[str]:
        return [o["kind"] for o in self.objects]

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.all(kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)} in {self.kinds()}"
        return found[0]

    def container(self) -> dict[str, Any]:
        containers = self.one("Deployment")["spec"]["template"]["spec"]["containers"]
        assert len(containers) == 1
        return dict(containers[0])

    def args(self) -> dict[str, str | None]:
        """Container args as {flag name: value}; a bare flag maps to None. Each flag appears once."""
        out: dict[str, str | None] = {}
        for arg in self.container()["args"]:
            assert arg.startswith("--"), arg
            name, sep, value = arg[2:].partition("=")
            assert name not in out, f"flag --{name} rendered twice"
            out[name] = value if sep else None
        return out


def helm_args(values: Mapping[str, Any] | None, sets: Iterable[str], tmp_path: Path) -> list[str | Path]:
    args: list[str | Path] = []
    if values is not None:
        values_file = tmp_path / f"values-{len(list(tmp_path.iterdir()))}.yaml"
        values_file.write_text(yaml.safe_dump(dict(values)))
        args += ["--values", values_file]
    for item in sets:
        args += ["--set", item]
    return args


def template(
    tmp_path: Path,
    values: Mapping[str, Any] | None = None,
    sets: Iterable[str] = (),
    *,
    chart: Path = CHART,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    cmd: list[str | Path] = [tool("helm"), "template", RELEASE, chart, "--namespace", NAMESPACE]
    cmd += ["--kube-version", KUBE_VERSION, *helm_args(values, sets, tmp_path)]
    return run(cmd, check=check)


def render(tmp_path: Path, values: Mapping[str, Any] | None = None, sets: Iterable[str] = ()) -> Rendered:
    proc = template(tmp_path, values, sets)
    objects = tuple(o for o in yaml.safe_load_all(proc.stdout) if o)
    return Rendered(proc.stdout, objects)


def kubeconform(manifests: str, tmp_path: Path) -> list[dict[str, Any]]:
    """Validate with kubeconform, strictly and offline; return its per-resource results (all must be valid)."""
    if not KUBE_SCHEMAS.is_dir():
        pytest.fail(f"{KUBE_SCHEMAS} is missing: run `bash scripts/install-tools.sh`")
    path = tmp_path / "rendered.yaml"
    path.write_text(manifests)
    proc = run(
        [
            tool("kubeconform"),
            "-strict",
            "-verbose",
            "-output",
            "json",
            "-schema-location",
            f"{KUBE_SCHEMAS}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
            "-schema-location",
            f"{CRD_SCHEMAS}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
            path,
        ],
        check=False,
    )
    results: list[dict[str, Any]] = json.loads(proc.stdout)["resources"]
    bad = [r for r in results if r["status"] != "statusValid"]
    assert not bad, f"kubeconform rejected the chart output: {bad}"
    assert proc.returncode == 0, proc.stderr
    return results
