"""The proxy's subset hint: which endpoints a request may go to (protocol.md §5).

The value is ``filter_metadata["envoy.lb.subset_hint"]["x-gateway-destination-endpoint-subset"]``. The
reference accepts a list of ``"ip:port"`` and matches by IP only; lwepp accepts a comma string and matches
exactly. picker accepts both forms: ``"ip"`` admits every port of that IP (all data-parallel ranks of a pod),
``"ip:port"`` (``"[v6]:port"``) admits exactly that endpoint. An empty list admits nothing (the request then
gets 503); no hint at all admits everything.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Protocol, TypeVar

from picker.request.model import Subset

__all__ = ["Addressed", "filter_candidates", "parse_subset"]


class Addressed(Protocol):
    """What the filter needs of an endpoint (``picker.endpoints.model.Endpoint``; request does not import it)."""

    @property
    def key(self) -> str: ...

    @property
    def address(self) -> str: ...


E = TypeVar("E", bound=Addressed)


def parse_subset(value: object) -> Subset | None:
    """The ``Subset`` of a subset-hint metadata value; ``None`` when there is no hint.

    A list of strings or one comma-separated string; entries that are not strings are ignored.
    """
    if value is None:
        return None
    entries: Iterable[object]
    if isinstance(value, str):
        entries = value.split(",")
    elif isinstance(value, list | tuple):
        entries = value
    else:
        return None  # as the reference: a value that is not a list is no hint
    addresses: set[str] = set()
    hostports: set[str] = set()
    for entry in entries:
        if not isinstance(entry, str):
            continue
        for part in entry.split(","):
            _add(part.strip(), addresses, hostports)
    return Subset(addresses=frozenset(addresses), hostports=frozenset(hostports))


def filter_candidates(endpoints: Iterable[E], subset: Subset | None) -> tuple[E, ...]:
    """The endpoints ``subset`` admits (all of them when there is no hint)."""
    if subset is None:
        return tuple(endpoints)
    return tuple(e for e in endpoints if subset.admits(e.key, e.address))


def _add(entry: str, addresses: set[str], hostports: set[str]) -> None:
    if not entry:
        return
    if entry.startswith("["):  # "[v6]:port" or "[v6]"
        close = entry.find("]")
        if close < 0:
            return
        host = _canonical(entry[1:close])
        rest = entry[close + 1 :]
        if not rest:
            addresses.add(host)
        elif rest.startswith(":") and _is_port(rest[1:]):
            hostports.add(f"[{host}]:{int(rest[1:])}")
        return
    if entry.count(":") > 1:  # a bare IPv6 address
        addresses.add(_canonical(entry))
        return
    host, sep, port = entry.partition(":")
    if not sep:
        addresses.add(_canonical(host))
    elif _is_port(port):
        hostports.add(f"{_canonical(host)}:{int(port)}")


def _is_port(text: str) -> bool:
    return text.isascii() and text.isdigit() and 0 < int(text) < 65536


def _canonical(host: str) -> str:
    """IPv6 in its compressed form (as the pod IP is written); anything else as given."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host
    return ip.compressed if ip.version == 6 else host
