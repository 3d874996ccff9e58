"""Process helpers for the end-to-end tests: the real Envoy and picker as subprocesses.

Ports, readiness, stopping and the Envoy binary come from the package (``picker.bench.procs`` and
``picker.bench.envoy``, shared with ``picker demo``); this module keeps the tests' own wrappers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence

from picker.bench import envoy
from picker.bench.envoy import envoy_binary
from picker.bench.procs import free_port, stop_process, wait_http

__all__ = ["envoy_binary", "free_port", "picker_binary", "run_envoy", "run_picker", "stop_process", "wait_http"]


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
