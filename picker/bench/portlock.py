"""A machine-wide lock on a fixed TCP port, so runs that need the same fixed port take turns.

NGINX Gateway Fabric's endpoint-picker shim always listens on 127.0.0.1:54800. Two test runs, a test run and a
demo, or two CI jobs on one machine would collide there; each holds ``hold(54800)`` while its shim runs. The lock
is ``flock`` on a file in the temporary directory: the kernel drops it when the holder exits, however it exits, so
a crashed run never leaves a stale lock. Waiting polls without blocking the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

__all__ = ["PortBusy", "hold", "lock_path"]


class PortBusy(RuntimeError):
    """The port's lock was not free within the wait, or a process outside the lock listens on the port."""


def lock_path(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"picker-port-{port}.lock"


@contextlib.asynccontextmanager
async def hold(
    port: int, *, wait_s: float = 300.0, poll_s: float = 0.1, free_wait_s: float = 65.0
) -> AsyncIterator[Path]:
    """Hold the lock of 127.0.0.1:``port`` for the block; waits up to ``wait_s`` for another holder to finish.

    Once held, the port must be free within ``free_wait_s``: a client connection elsewhere on the machine may have
    it as its ephemeral local port (the kernel hands out ports of that range to outgoing connections) until it
    closes, or for the 60 s of TIME_WAIT after; a listener there that took no lock stays and is reported."""
    path = lock_path(port)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # any user's run may take it next (the umask narrowed the mode)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if loop.time() >= deadline:
                    holder = path.read_text().strip() or "unknown"
                    raise PortBusy(
                        f"127.0.0.1:{port} is held by another run (pid {holder}, lock {path}) for over {wait_s:g} s"
                    ) from None
                await asyncio.sleep(poll_s)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        free_by = loop.time() + free_wait_s
        while not _is_free(port):
            if loop.time() >= free_by:
                raise PortBusy(
                    f"127.0.0.1:{port} is in use by a process that holds no lock ({lock_path(port)}) for over "
                    f"{free_wait_s:g} s"
                )
            await asyncio.sleep(poll_s)
        yield path
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            return False
        return True
