"""Processes and ports: what the ``--workers`` supervisor, the benchmarks and the tests all need.

``free_ports`` picks ports *below* the kernel's ephemeral range: a port from ``bind(0)`` is an ephemeral one,
which any outgoing connection of this or another process may take as its source port between the check and the
server's bind (address already in use). Below that range only another explicit bind can take it.
"""

from __future__ import annotations

import contextlib
import ctypes
import random
import signal
import socket
from collections.abc import Sequence

__all__ = ["die_with_parent", "free_ports"]

_PR_SET_PDEATHSIG = 1


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


_rng = random.Random()  # seeded from the OS: parallel processes do not walk the same ports
_given: set[int] = set()


def free_ports(n: int = 1, *, consecutive: bool = False, hosts: Sequence[str] = ("127.0.0.1",)) -> list[int]:
    """``n`` ports free on every one of ``hosts`` right now, ``consecutive`` or not, for a server started later;
    chosen at random below the ephemeral range, each handed out once per process."""
    low, _ = _ephemeral_range()
    first, last = (10000, low - 1) if low > 10000 + 1000 else (61000, 65535 - 1)  # else: above a low range
    for _ in range(1000):
        base = _rng.randint(first, last - n)
        ports = list(range(base, base + n)) if consecutive else [base, *_rng.sample(range(first, last), n - 1)]
        if len(set(ports)) != n or _given & set(ports) or not all(_bindable(h, p) for p in ports for h in hosts):
            continue
        _given.update(ports)
        return sorted(ports)
    raise OSError(f"no {n} free ports on {', '.join(hosts)} in [{first}, {last}]")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def die_with_parent() -> None:
    """SIGTERM this process when its parent dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``; a no-op elsewhere).
    In a child before exec, or first thing in a spawned worker."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
