"""Process helpers for the end-to-end tests: the real Envoy and picker as subprocesses.

Ports, readiness, stopping and the Envoy binary come from the package (``picker.bench.procs`` and
``picker.bench.envoy``, shared with ``picker demo``); this module keeps the tests' own wrappers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from picker.bench import envoy
from picker.bench.envoy import envoy_binary
from picker.bench.procs import free_port, stop_process, wait_http

__all__ = [
    "assert_nothing_left",
    "envoy_binary",
    "finish_demo",
    "free_port",
    "picker_binary",
    "run_demo",
    "run_envoy",
    "run_picker",
    "session_members",
    "stop_process",
    "wait_http",
]


def picker_binary() -> list[str]:
    return [sys.executable, "-m", "picker.cli"]


@contextlib.asynccontextmanager
async def run_envoy(
    config_yaml: str, admin_port: int, *, concurrency: int = 1
) -> AsyncIterator[asyncio.subprocess.Process]:
    async with envoy.run_envoy(config_yaml, admin_port, concurrency=concurrency) as child:
        yield child.proc


@contextlib.asynccontextmanager
async def run_picker(args: Sequence[str], health_url: str | None = None) -> AsyncIterator[asyncio.subprocess.Process]:
    """``picker serve ARGS`` as a subprocess; yields once its metrics port answers."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with tempfile.TemporaryFile() as log:
        proc = await asyncio.create_subprocess_exec(
            # No grace period unless a test asks for one (a later --grace-period wins): nothing here watches
            # picker's health to notice the drain, and the default 5 s would be spent on every teardown.
            *picker_binary(),
            "serve",
            "--grace-period",
            "0s",
            *args,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
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


def run_demo(cwd: Path, args: Sequence[str], timeout_s: float) -> str:
    """``picker demo ARGS`` in ``cwd`` to its end; its output. Fails the test on a timeout or a non-zero exit."""
    argv = [sys.executable, "-m", "picker.cli", "demo", *args]
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    code, out = finish_demo(proc, timeout_s)
    assert code == 0, out
    return out


def finish_demo(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, str]:
    """Wait for a demo started in its own session: (exit code, output). On a timeout the whole session is killed
    and the test fails with the output's tail."""
    try:
        raw, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raw, _ = proc.communicate()
        pytest.fail(f"the demo did not finish in {timeout_s:g} s:\n{raw.decode(errors='replace')[-4000:]}")
    return proc.returncode, raw.decode(errors="replace")


def session_members(sid: int) -> list[str]:
    """Command lines of live (non-zombie) processes in session ``sid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            found.append(f"{entry.name}: {cmdline}")
    return found


def assert_nothing_left(sid: int) -> None:
    """No live process is left in session ``sid`` (a demo started with ``start_new_session``), within 5 s."""
    for _ in range(50):  # children are reaped by the demo before it exits; allow the kernel a moment
        left = session_members(sid)
        if not left:
            return
        time.sleep(0.1)
    pytest.fail(f"processes left behind: {left}")
