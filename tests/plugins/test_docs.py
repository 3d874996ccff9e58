"""docs/plugins.md says what the code does: its snippets are the shipped files, and they work."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.deploy._tools import render, run, tool

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "plugins.md").read_text()
EXAMPLE = ROOT / "examples" / "picker-label-affinity"


def block(lang: str, after: str) -> str:
    """The first ``lang`` code block after the heading or text ``after``."""
    match = re.search(re.escape(after) + r".*?```" + lang + r"\n(.*?)```", DOCS, re.S)
    assert match, f"no {lang} block after {after!r}"
    return match.group(1)


def test_the_twenty_line_scorer_is_the_shipped_one() -> None:
    snippet = block("python", "## 1. Write a scorer in 20 lines")
    shipped = (EXAMPLE / "src" / "picker_label_affinity" / "affinity.py").read_text()
    assert snippet in shipped
    code = [ln for ln in snippet.splitlines() if ln.strip() and not ln.lstrip().startswith(("from ", "import "))]
    assert len(code) <= 20


def test_the_dockerfile_is_the_shipped_one_and_lints_clean() -> None:
    dockerfile = EXAMPLE / "Dockerfile"
    assert block("dockerfile", "## 10. Shipping it") == dockerfile.read_text()
    proc = run([tool("hadolint"), "--no-color", dockerfile], check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_helm_values_render_a_config_the_installed_plugin_loads(plugin_python: Path, tmp_path: Path) -> None:
    values: dict[str, Any] = yaml.safe_load(block("yaml", "Then point the chart at that image"))
    values["inferencePool"] = {"modelServers": {"matchLabels": {"app": "vllm"}}}
    rendered = render(tmp_path, values)
    container = rendered.container()
    assert container["image"] == "registry.example.com/picker-affinity:0.1.0"
    assert rendered.args()["config-file"] == "/config/affinity-plugins.yaml"
    config = tmp_path / "affinity-plugins.yaml"
    config.write_text(rendered.one("ConfigMap")["data"]["affinity-plugins.yaml"])
    check = (
        "import sys\n"
        "from picker.endpoints.inflight import InflightTracker\n"
        "from picker.plugins import PluginContext\n"
        "from picker.scheduling.config import load_config_file\n"
        "c = load_config_file(sys.argv[1], PluginContext(clock=lambda: 0.0, inflight=InflightTracker()))\n"
        "print(type(c.plugins['label-affinity-scorer']).__name__, c.profiles['default'].weights)\n"
    )
    done = subprocess.run([plugin_python, "-c", check, config], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("GuardedScorer")


def test_the_testing_snippet_runs_against_the_installed_package(plugin_python: Path, tmp_path: Path) -> None:
    snippet = block("python", "## 9. Testing a plugin")
    done = subprocess.run([plugin_python, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "'label-affinity-scorer': {'10.0.0.1:8000': 0.0, '10.0.0.2:8000': 1.0}" in done.stdout


def test_the_first_config_loads_with_the_example_by_module_path(plugin_python: Path, tmp_path: Path) -> None:
    config = tmp_path / "plugins.yaml"
    config.write_text(block("yaml", "Name it in the config"))
    check = (
        "import sys\n"
        "from picker.endpoints.inflight import InflightTracker\n"
        "from picker.plugins import PluginContext\n"
        "from picker.scheduling.config import load_config_file\n"
        "c = load_config_file(sys.argv[1], PluginContext(clock=lambda: 0.0, inflight=InflightTracker()))\n"
        "p = c.plugins['tenant-affinity']\n"
        "print(p.type, p.plugin.header, c.profiles['default'].weights['tenant-affinity'])\n"
    )
    done = subprocess.run([plugin_python, "-c", check, config], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["picker_label_affinity:LabelAffinityScorer", "x-tenant", "4.0"]
