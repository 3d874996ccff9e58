"""Child processes for the demo and the end-to-end tests: free ports, readiness checks, cleanup that happens.

``spawn`` starts a command with its output in a temporary file and stops it when the block exits, however it
exits (error, cancellation, Ctrl-C): SIGTERM, then SIGKILL after a timeout. On Linux each child also gets
``PR_SET_PDEATHSIG``: if the parent dies without cleaning up (SIGKILL), the kernel sends the child SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import aiohttp

from picker.procutil import die_with_parent, free_ports

__all__ = [
    "Child",
    "ChildFailed",
    "Interrupt",
    "announce_into",
    "cancel_on_signals",
    "free_port",
    "free_ports",
    "picker_command",
    "spawn",
    "stop_process",
    "tool_binary",
    "wait_http",
]


class ChildFailed(RuntimeError):
    """A child process exited when it should be running, or never became ready."""


def free_port() -> int:
    """A port free on 127.0.0.1 right now, outside the ephemeral range (``free_ports``)."""
    return free_ports(1)[0]


_TOOLS_BIN = Path(__file__).resolve().parents[2] / ".tools" / "bin"


def tool_binary(name: str) -> str | None:
    """A program ``scripts/install-tools.sh`` builds into ``.tools/bin`` (else one on PATH), or None."""
    for candidate in (_TOOLS_BIN / name, shutil.which(name)):
        if candidate and Path(candidate).exists():
            return str(candidate)
    return None


def picker_command() -> list[str]:
    """``picker`` as this interpreter runs it (works in a venv that is not on PATH)."""
    return [sys.executable, "-m", "picker.cli"]


async def wait_http(url: str, timeout_s: float = 20.0, proc: asyncio.subprocess.Process | None = None) -> None:
    """Poll ``url`` until it answers below 500; fails early if ``proc`` exits."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            if proc is not None and proc.returncode is not None:
                raise ChildFailed(f"process exited with {proc.returncode} before {url} answered")
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as resp:
                    if resp.status < 500:
                        return
            if loop.time() > deadline:
                raise ChildFailed(f"{url} did not answer within {timeout_s:g} s")
            await asyncio.sleep(0.1)


async def stop_process(proc: asyncio.subprocess.Process, timeout_s: float = 10.0) -> int:
    """SIGTERM, wait up to ``timeout_s``, then SIGKILL. Returns the exit code (negative: killed by a signal)."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode


class Child:
    """A started process: its name, its output so far, and checks that it is still running."""

    def __init__(self, name: str, argv: Sequence[str], proc: asyncio.subprocess.Process, log: IO[bytes]) -> None:
        self.name = name
        self.argv = list(argv)
        self.proc = proc
        self._log = log
        self.stopping = False
        # A program with no SIGTERM handler (NGF's shim) dies by the signal ``stop`` sends: that is a clean stop.
        self.dies_on_sigterm = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        """Its exit code once it exited; 0 for a clean stop (see ``dies_on_sigterm``)."""
        code = self.proc.returncode
        if code == -signal.SIGTERM and self.dies_on_sigterm and self.stopping:
            return 0
        return code

    def output(self, tail_bytes: int = 6000) -> str:
        """The last ``tail_bytes`` of its output. ``pread``: the child shares the file offset, so no seeking."""
        with contextlib.suppress(OSError, ValueError):
            fd = self._log.fileno()
            size = os.fstat(fd).st_size
            start = max(0, size - tail_bytes)
            return os.pread(fd, size - start, start).decode(errors="replace")
        return ""

    def check(self) -> None:
        """Raise ``ChildFailed`` (with the tail of its output) if the process has exited."""
        if self.proc.returncode is not None and not self.stopping:
            raise ChildFailed(f"{self.name} exited with {self.proc.returncode}:\n{self.output()}")

    async def wait_http(self, url: str, timeout_s: float = 20.0) -> None:
        try:
            await wait_http(url, timeout_s, self.proc)
        except ChildFailed as exc:
            raise ChildFailed(f"{self.name}: {exc}\n{self.output()}") from None

    async def stop(self, timeout_s: float = 10.0) -> int:
        """Stop it (SIGTERM, then SIGKILL after ``timeout_s``); its exit code, 0 for a clean stop."""
        self.stopping = True
        code = await stop_process(self.proc, timeout_s)
        return 0 if self.dies_on_sigterm and code == -signal.SIGTERM else code  # as ``returncode``


@dataclass(slots=True)
class Interrupt:
    """The first SIGINT or SIGTERM a run got (``cancel_on_signals``); None: none."""

    signum: int | None = None

    def stopping_signal(self, exc: BaseException) -> int | None:
        """The signal that ended a run which raised ``exc``: the one noted, or SIGINT for a KeyboardInterrupt raised
        before the handlers were installed; None: the run failed on its own."""
        if self.signum is not None:
            return self.signum
        return signal.SIGINT if isinstance(exc, KeyboardInterrupt) else None


def cancel_on_signals(stopped: Interrupt) -> None:
    """SIGINT and SIGTERM cancel the running task, the first of them noted in ``stopped``. The children are stopped
    by the context managers that started them, as the cancellation unwinds."""
    main = asyncio.current_task()
    assert main is not None
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stopped.signum is None:
            stopped.signum = signum
            main.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)


def announce_into(children: list[Child]) -> Callable[[Child], None]:
    """An ``on_start`` callback: each child started is added to ``children`` (a run's JSON lists them, so a test
    can check they are gone) and announced."""

    def started(child: Child) -> None:
        children.append(child)
        print(f"  started {child.name} (pid {child.pid})", flush=True)

    return started


@contextlib.asynccontextmanager
async def spawn(
    name: str,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stop_timeout_s: float = 10.0,
    on_start: Callable[[Child], None] | None = None,
) -> AsyncIterator[Child]:
    """Run ``argv`` for the duration of the block (output to a temporary file); always stopped on exit."""
    with tempfile.TemporaryFile(prefix=f"picker-{name}-") as log:
        # setpriv (util-linux) sets the parent-death signal and execs: the same pid, and no Python run between
        # fork and exec. A preexec_fn makes subprocess fork() instead of vfork(), which runs grpc's atfork
        # handlers in the child, and a grpc poller restarted there aborted on descriptors closed before exec
        # ("epoll_wait error: Bad file descriptor", simulators in the reliability tests).
        setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
        command = [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else list(argv)
        proc = await asyncio.create_subprocess_exec(
            *command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            preexec_fn=die_with_parent if sys.platform == "linux" and not setpriv else None,
        )
        child = Child(name, argv, proc, log)
        if on_start is not None:
            on_start(child)
        try:
            yield child
        finally:
            await _stop_even_if_cancelled(child, stop_timeout_s)


async def _stop_even_if_cancelled(child: Child, timeout_s: float) -> None:
    """Stop ``child``; a cancellation meanwhile (a second Ctrl-C) is re-raised only once it is stopped."""
    stopping = asyncio.ensure_future(child.stop(timeout_s))
    cancelled = False
    while not stopping.done():
        try:
            await asyncio.shield(stopping)
        except asyncio.CancelledError:
            if stopping.cancelled():
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
