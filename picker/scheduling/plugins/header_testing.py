"""header-based-testing-filter: keep only the endpoints a test names in the request (conformance tests).

Type ``header-based-testing-filter``. Input: the request header ``test-epp-endpoint-selection``, a comma list of
``ip`` or ``ip:port`` (IPv6 bracketed with a port). An ``ip:port`` item keeps exactly that endpoint; an ``ip`` item
keeps every endpoint of that IP (each data-parallel rank; the reference keeps one of them). Kept endpoints come in
the header's order, each once; a missing or blank header keeps none (the profile then fails). Testing only.
No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from picker.plugins import CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.request import headers as hdr
from picker.scheduling.framework import Filter
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "HeaderBasedTestingFilter", "Params", "create", "parse_item"]

TYPE = "header-based-testing-filter"


class Params(PluginParams):
    """No parameters."""


def parse_item(item: str) -> tuple[str, int | None]:
    """``(ip, port)`` from ``ip``, ``ip:port``, ``[v6]`` or ``[v6]:port`` (port None when absent or not a number)."""
    item = item.strip()
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif item.count(":") == 1:
        host, _, port = item.partition(":")
    else:  # a bare IPv4 address, or a bare (unbracketed) IPv6 address
        host, port = item, ""
    return host, int(port) if port.isdigit() else None


class HeaderBasedTestingFilter:
    type: ClassVar[str] = TYPE
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        value = req.headers.get(hdr.TEST_ENDPOINT_SELECTION, "")
        if not value.strip():
            return []
        kept: dict[str, Endpoint] = {}
        for item in value.split(","):
            if not item.strip():
                continue
            host, port = parse_item(item)
            for e in endpoints:
                if e.address == host and (port is None or e.port == port):
                    kept.setdefault(e.key, e)
        return list(kept.values())


def create(name: str, params: Params, ctx: PluginContext) -> Filter:
    return HeaderBasedTestingFilter(name)


SPEC = PluginSpec(TYPE, Params, create)
