"""The Dockerfile, checked statically (no container engine runs here): stage rules, the pinned dependency layer,
the non-root numeric user the chart expects, entrypoint, labels, ports; and hadolint (from PyPI) finds nothing."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from picker.cli import SUBCOMMANDS

from ._tools import CHART, REPO, run, tool

DOCKERFILE = REPO / "Dockerfile"


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, op: str) -> list[str]:
        return [arg for name, arg in self.instructions if name == op]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert op == "ARG", f"{op} before the first FROM"
            key, _, default = rest.partition("=")
            args[key] = default
        else:
            stages[-1].instructions.append((op, rest.strip()))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text())[1]


def test_multi_stage_slim_python_311(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    builder, final = stages[0], stages[-1]
    assert builder.name == "builder"
    assert final.name is None
    assert re.fullmatch(r"python:3\.11-slim(-\w+)?", final.base), final.base
    assert builder.base == final.base  # the venv's interpreter path must exist in the final image


def test_dependencies_layer_before_source_and_pinned(stages: list[Stage]) -> None:
    builder = stages[0]
    ops = builder.instructions
    copies = [(i, arg) for i, (op, arg) in enumerate(ops) if op == "COPY"]
    deps_copy = next(i for i, arg in copies if "constraints.txt" in arg and "pyproject.toml" in arg)
    source_copy = next(i for i, arg in copies if arg.split()[0] == "picker")
    deps_install = next(i for i, (op, arg) in enumerate(ops) if op == "RUN" and "-c constraints.txt" in arg)
    assert deps_copy < deps_install < source_copy
    assert "--only-binary=:all:" in ops[deps_install][1]  # never compiles a dependency
    source_install = next(
        i for i, (op, arg) in enumerate(ops) if op == "RUN" and "pip install" in arg and i > source_copy
    )
    assert "--no-deps" in ops[source_install][1]


def test_dependency_list_command_reads_pyproject(stages: list[Stage], tmp_path: Path) -> None:
    """Run the builder's own requirements one-liner against the repo's pyproject.toml."""
    run_line = next(arg for op, arg in stages[0].instructions if op == "RUN" and "tomllib" in arg)
    command = run_line.split(" > /tmp/requirements.txt")[0]
    words = shlex.split(command)
    assert words[:2] == ["python", "-c"]
    out = subprocess.run([sys.executable, "-c", words[2]], cwd=REPO, capture_output=True, text=True, check=True)
    requirements = out.stdout.split()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert requirements == project["dependencies"] + project["optional-dependencies"]["kube"]
    # Every requirement is pinned by constraints.txt, so the image build is reproducible.
    pinned = {
        re.split(r"==", line)[0].lower().replace("_", "-")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    for requirement in requirements:
        name = re.split(r"[<>=!~\[; ]", requirement)[0].lower().replace("_", "-")
        assert name in pinned, f"{name} is not pinned in constraints.txt"


def test_final_stage_has_only_the_venv(stages: list[Stage]) -> None:
    final = stages[-1]
    assert final.all("COPY") == ["--from=builder /opt/venv /opt/venv"]
    text = " ".join(arg for _, arg in final.instructions)
    for tool_name in ("gcc", "build-essential", "apt-get", "pip install", "make "):
        assert tool_name not in text
    assert not final.all("RUN")


def test_runs_as_numeric_non_root_matching_the_chart(stages: list[Stage]) -> None:
    users = stages[-1].all("USER")
    assert len(users) == 1
    uid, _, gid = users[0].partition(":")
    assert uid.isdigit()
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    values = yaml.safe_load((CHART / "values.yaml").read_text())["inferenceExtension"]
    assert int(uid) == values["securityContext"]["runAsUser"] == values["podSecurityContext"]["runAsUser"] == 65532


def test_entrypoint_is_picker_serve(stages: list[Stage]) -> None:
    (entrypoint,) = stages[-1].all("ENTRYPOINT")
    assert yaml.safe_load(entrypoint) == ["picker", "serve"]  # exec form: signals reach picker directly
    assert "serve" in SUBCOMMANDS
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["picker"] == "picker.cli:main"


def test_oci_labels_and_ports(stages: list[Stage]) -> None:
    labels = " ".join(stages[-1].all("LABEL"))
    for key in ("title", "description", "version", "revision", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    exposed = {int(p) for arg in stages[-1].all("EXPOSE") for p in arg.split()}
    values = yaml.safe_load((CHART / "values.yaml").read_text())["inferenceExtension"]
    assert exposed == {values["extProcPort"], values["healthPort"], values["metricsPort"]} == {9002, 9003, 9090}


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [x for x in (REPO / ".dockerignore").read_text().splitlines() if x and not x.startswith("#")]
    assert lines[0] == "*"
    allowed = {x[1:].rstrip("/") for x in lines if x.startswith("!")}
    assert allowed == {
        "pyproject.toml",
        "constraints.txt",
        "README.md",
        "setup.py",
        "picker",
        "native/front/Cargo.toml",
        "native/front/Cargo.lock",
        "native/front/src",
    }
    assert all((REPO / path).exists() for path in allowed)
    assert "**/*.so" in lines  # a locally built extension stays out: the image compiles its own


def test_hadolint_finds_nothing() -> None:
    proc = run([tool("hadolint"), "--no-color", DOCKERFILE], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_does_flag_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\nUSER root\n")
    proc = run([tool("hadolint"), "--no-color", bad], check=False)
    assert proc.returncode != 0
    for rule in ("DL3007", "DL3008", "DL3002"):
        assert rule in proc.stdout
