"""portlock: runs needing one fixed port (NGF's shim: 127.0.0.1:54800) take turns, across processes."""

from __future__ import annotations

import asyncio
import os
import socket
import sys

import pytest

from picker.bench import portlock
from picker.bench.procs import free_port


async def test_a_second_holder_waits_for_the_first() -> None:
    port = free_port()
    order: list[str] = []

    async def first() -> None:
        async with portlock.hold(port):
            order.append("first in")
            await asyncio.sleep(0.3)
            order.append("first out")

    async def second() -> None:
        await asyncio.sleep(0.05)
        async with portlock.hold(port, poll_s=0.02):
            order.append("second in")

    await asyncio.gather(first(), second())
    assert order == ["first in", "first out", "second in"]


async def test_a_holder_in_another_process_is_waited_for_then_reported() -> None:
    port = free_port()
    path = portlock.lock_path(port)
    code = (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(path)!r}, os.O_RDWR | os.O_CREAT, 0o666)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\n"
        "os.write(fd, b'4242')\n"
        "print('locked', flush=True)\n"
        "time.sleep(float(sys.argv[1]))\n"
    )
    holder = await asyncio.create_subprocess_exec(sys.executable, "-c", code, "30", stdout=asyncio.subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert await holder.stdout.readline() == b"locked\n"
        with pytest.raises(portlock.PortBusy, match=r"held by another run \(pid 4242"):
            async with portlock.hold(port, wait_s=0.3):
                pass
        holder.kill()  # the kernel drops a dead process's lock: no stale lock
        await holder.wait()
        async with portlock.hold(port, wait_s=5.0):
            assert path.read_text() == f"{os.getpid()}\n"
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


async def test_a_listener_that_took_no_lock_is_reported() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(portlock.PortBusy, match="in use by a process that holds no lock"):
            async with portlock.hold(port, free_wait_s=0.3, poll_s=0.02):
                pass


async def test_a_connection_that_has_the_port_for_a_moment_is_waited_for() -> None:
    # An outgoing connection may get the fixed port as its ephemeral local port; it goes away with the connection.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.socket() as client:
            client.bind(("127.0.0.1", 0))
            port = client.getsockname()[1]
            client.connect(server.getsockname())
            accepted, _ = server.accept()

            async def close_soon() -> None:
                await asyncio.sleep(0.3)
                accepted.close()  # the server closes first: its side waits out TIME_WAIT, the client's port is free
                await asyncio.sleep(0.05)
                client.close()

            closing = asyncio.create_task(close_soon())
            async with portlock.hold(port, free_wait_s=5.0, poll_s=0.02):
                assert closing.done()
