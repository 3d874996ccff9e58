"""disagg-headers-handler (llm-d, deprecated there): tell the decode pod's sidecar where to prefill and encode.

Types ``disagg-headers-handler`` and its older alias ``prefill-header-handler``. A ``RequestHeaders`` hook: once
the destination is chosen it sets, on the request routed to the decode endpoint,

* ``x-prefiller-host-port: ip:port``: the first target of the ``prefillProfile`` profile's result, when that
  profile ran and found one (IPv6 as ``[ip]:port``);
* ``x-encoder-hosts-ports: ip:port,ip:port,…``: every target of the ``encodeProfile`` profile's result.

picker sets these headers on the routing answer (overwriting what a client sent) and removes client-sent ones
when it sets none, as llm-d's PreRequest deletes them first: the sidecar acts on them, so a client must never
choose them. ``disagg-profile-handler`` sets the same headers itself (llm-d ≥ 0.9); configs that still list this
plugin next to it load unchanged, and the headers are the same.

Parameters: ``prefillProfile`` "prefill"; ``encodeProfile`` "encode".
"""

from __future__ import annotations

from collections.abc import Mapping

from picker.plugins import InferenceRequest, PluginContext, PluginParams, SchedulingResult
from picker.request import headers as hdr
from picker.scheduling.framework import RequestHeaders
from picker.scheduling.spec import PluginSpec

__all__ = [
    "LEGACY_SPEC",
    "LEGACY_TYPE",
    "SPEC",
    "TYPE",
    "DisaggHeadersHandler",
    "Params",
    "create",
    "disagg_headers",
]

TYPE = "disagg-headers-handler"
LEGACY_TYPE = "prefill-header-handler"


def disagg_headers(result: SchedulingResult, prefill_profile: str, encode_profile: str) -> dict[str, str]:
    """The llm-d sidecar headers of a scheduling result (empty: serve it decode-only, as aggregated)."""
    out: dict[str, str] = {}
    prefill = result.profile_results.get(prefill_profile)
    if prefill is not None and prefill.targets:
        out[hdr.PREFILLER] = prefill.targets[0].key
    encode = result.profile_results.get(encode_profile)
    if encode is not None and encode.targets:
        out[hdr.ENCODERS] = ",".join(e.key for e in encode.targets)
    return out


class Params(PluginParams):
    prefill_profile: str = "prefill"
    encode_profile: str = "encode"


class DisaggHeadersHandler:
    __slots__ = ("_encode", "_prefill", "name", "type")

    def __init__(self, name: str, params: Params, type_name: str = TYPE) -> None:
        self.name = name
        self.type = type_name  # the alias keeps its own type name
        self._prefill = params.prefill_profile
        self._encode = params.encode_profile

    def request_headers(self, req: InferenceRequest, result: SchedulingResult) -> Mapping[str, str]:
        return disagg_headers(result, self._prefill, self._encode)


def create(name: str, params: Params, ctx: PluginContext) -> RequestHeaders:
    return DisaggHeadersHandler(name, params)


def _legacy(name: str, params: Params, ctx: PluginContext) -> RequestHeaders:
    return DisaggHeadersHandler(name, params, LEGACY_TYPE)


SPEC = PluginSpec(TYPE, Params, create)
LEGACY_SPEC = PluginSpec(LEGACY_TYPE, Params, _legacy)
