"""decode-filter, prefill-filter, encode-filter (llm-d): keep the endpoints of a disaggregation role.

Types ``decode-filter`` (this module's ``SPEC``), ``prefill-filter``, ``encode-filter``. Input: each candidate's
``llm-d.ai/role`` label. Kept roles:

* ``decode-filter``: decode, prefill-decode, both (deprecated), encode-prefill-decode — or no role label at all
  (an ordinary, aggregated endpoint decodes);
* ``prefill-filter``: prefill, encode-prefill, prefill-decode, both, encode-prefill-decode;
* ``encode-filter``: encode, encode-prefill, encode-prefill-decode.

No parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

from picker.plugins import CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.scheduling.framework import Filter
from picker.scheduling.spec import PluginSpec

__all__ = [
    "DECODE",
    "ENCODE",
    "ENCODE_SPEC",
    "PREFILL",
    "PREFILL_SPEC",
    "ROLE_LABEL",
    "SPEC",
    "TYPE",
    "Params",
    "RoleFilter",
    "create",
]

ROLE_LABEL = "llm-d.ai/role"
DECODE, PREFILL, ENCODE = "decode-filter", "prefill-filter", "encode-filter"
TYPE = DECODE

_ROLES: dict[str, tuple[frozenset[str], bool]] = {  # type -> (kept roles, keep endpoints without the label)
    DECODE: (frozenset({"decode", "prefill-decode", "both", "encode-prefill-decode"}), True),
    PREFILL: (frozenset({"prefill", "encode-prefill", "prefill-decode", "both", "encode-prefill-decode"}), False),
    ENCODE: (frozenset({"encode", "encode-prefill", "encode-prefill-decode"}), False),
}


class Params(PluginParams):
    """No parameters."""


class RoleFilter:
    __slots__ = ("_roles", "_unlabelled", "name", "type")

    def __init__(self, name: str, type_name: str = DECODE) -> None:
        self.name = name
        self.type = type_name
        self._roles, self._unlabelled = _ROLES[type_name]

    def filter(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        roles, unlabelled = self._roles, self._unlabelled
        kept: list[Endpoint] = []
        for e in endpoints:
            role = e.labels.get(ROLE_LABEL)
            if role in roles if role is not None else unlabelled:
                kept.append(e)
        return kept


def create(name: str, params: Params, ctx: PluginContext) -> Filter:
    return RoleFilter(name, DECODE)


def _prefill(name: str, params: Params, ctx: PluginContext) -> Filter:
    return RoleFilter(name, PREFILL)


def _encode(name: str, params: Params, ctx: PluginContext) -> Filter:
    return RoleFilter(name, ENCODE)


SPEC = PluginSpec(DECODE, Params, create)
PREFILL_SPEC = PluginSpec(PREFILL, Params, _prefill)
ENCODE_SPEC = PluginSpec(ENCODE, Params, _encode)
