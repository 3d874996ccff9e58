"""``procutil.free_ports``: ports a server can bind later, which no outgoing connection takes as its source port."""

from __future__ import annotations

import socket

from picker import procutil


def test_free_ports_are_bindable_distinct_and_outside_the_ephemeral_range() -> None:
    low, high = procutil._ephemeral_range()
    ports = procutil.free_ports(5) + [procutil.free_ports(1)[0] for _ in range(5)]
    assert len(set(ports)) == len(ports)  # handed out once per process
    for port in ports:
        assert not low <= port <= high
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_consecutive_free_ports() -> None:
    base, *rest = procutil.free_ports(4, consecutive=True)
    assert rest == [base + 1, base + 2, base + 3]


def test_free_ports_on_several_addresses() -> None:
    hosts = ("127.0.0.2", "127.0.0.3")
    [port] = procutil.free_ports(1, hosts=hosts)
    for host in hosts:  # the same port binds on each (the pods of the soak and reliability stand-ins)
        with socket.socket() as s:
            s.bind((host, port))
