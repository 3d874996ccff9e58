"""The plugin venv: the example package pip-installed into a fresh virtualenv (shared by the tests here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "picker-label-affinity"


@pytest.fixture(scope="session")
def plugin_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv with the example installed by pip; picker comes from the project venv."""
    root = tmp_path_factory.mktemp("plugin-venv")
    venv_dir = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv_dir)], check=True, timeout=120)
    python = venv_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    # `--system-site-packages` would expose the base interpreter's packages, not the project venv's (picker,
    # its dependencies, pip, setuptools): a .pth adding the project venv's site-packages does that for a venv.
    Path(purelib, "picker-project.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"
    )
    source = shutil.copytree(EXAMPLE, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    install: list[str | Path] = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    install += ["--no-index", "--no-deps", "--no-build-isolation", str(source)]  # offline: setuptools is here
    done = subprocess.run(install, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return python
