"""Child processes for the demo and the end-to-end tests: free ports, readiness checks, cleanup that happens.

``spawn`` starts a command with its output in a temporary file and stops it when the block exits, however it
exits (error, cancellation, Ctrl-C): SIGTERM, then SIGKILL after a timeout. On Linux each child also gets
``PR_SET_PDEATHSIG``: if the parent dies without cleaning up (SIGKILL), the kernel sends the child SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import IO

import aiohttp

__all__ = ["Child", "ChildFailed", "free_port", "free_ports", "picker_command", "spawn", "stop_process", "wait_http"]

_PR_SET_PDEATHSIG = 1


class ChildFailed(RuntimeError):
    """A child process exited when it should be running, or never became ready."""


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_rng = random.Random()  # seeded from the OS: parallel processes do not walk the same ports
_given: set[int] = set()


def free_ports(n: int = 1, *, consecutive: bool = False) -> list[int]:
    """``n`` ports free on 127.0.0.1 right now, ``consecutive`` or not, for a server started later.

    Chosen at random *below* the kernel's ephemeral range: a port from ``bind(0)`` is an ephemeral one, which any
    outgoing connection of this or another process may take as its source port between the check and the
    server's bind (address already in use). Below that range only another explicit bind can take it. Each port is
    handed out once per process."""
    low, _ = _ephemeral_range()
    first, last = (10000, low - 1) if low > 10000 + 1000 else (61000, 65535 - 1)  # else: above a low range
    for _ in range(1000):
        base = _rng.randint(first, last - n)
        ports = list(range(base, base + n)) if consecutive else [base, *_rng.sample(range(first, last), n - 1)]
        if len(set(ports)) != n or _given & set(ports) or not all(_bindable(p) for p in ports):
            continue
        _given.update(ports)
        return sorted(ports)
    raise OSError(f"no {n} free ports on 127.0.0.1 in [{first}, {last}]")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free on 127.0.0.1 right now, outside the ephemeral range (``free_ports``)."""
    return free_ports(1)[0]


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


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class Child:
    """A started process: its name, its output so far, and checks that it is still running."""

    def __init__(self, name: str, argv: Sequence[str], proc: asyncio.subprocess.Process, log: IO[bytes]) -> None:
        self.name = name
        self.argv = list(argv)
        self.proc = proc
        self._log = log
        self.stopping = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

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
        self.stopping = True
        return await stop_process(self.proc, timeout_s)


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
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
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
