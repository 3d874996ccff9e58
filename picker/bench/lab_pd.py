"""Prefill/decode disaggregation in the policy lab: fleets with roles, and llm-d's sidecar in virtual time.

A P/D fleet gives each engine an ``llm-d.ai/role`` label (``LabConfig.roles``: "prefill", "decode", "both" or
"" for none), which the role filters of a P/D ``EndpointPickerConfig`` read. When the policy's decision carries
``x-prefiller-host-port`` (the disaggregation handler's ``RequestHeaders``), the lab does what the decode pod's
sidecar does (``picker.sim.sidecar``): it first sends the prefill, the request's prompt with ``max_tokens`` 1, to
the named engine; when that finishes, it sends the request to the decode engine with ``remote_prefill``, whose
engine pulls the prompt's KV over its link (``EngineConfig.kv_transfer_s_per_token``) before decoding. The
client-visible TTFT runs from arrival to the decode engine's first token, so it includes the prefill, the
transfer and one decode step; network and proxy time are zero, as everywhere in the lab.

As the director does, the router holds a lease on the prefill engine for the prompt from the pick until the
decode engine's first token (or the request's end), so ledger-based scorers in the prefill profile see it.

``Fleet`` names a fleet for the P/D benchmark (``lab_pd_cli``): ``"8"`` is eight engines without roles, ``"2p6d"``
two prefill and six decode engines. ``pd_config(decider)`` is llm-d's P/D sample configuration
(``pd-epp-config.yaml``: prefix 2 + queue 1 in a ``prefill`` and a ``decode`` profile behind the role filters)
with the decider of one's choice; on a fleet without roles it routes like an aggregated config, decode-only.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from picker.request import headers as hdr
from picker.request.model import InferenceRequest
from picker.scheduling.plugins.roles import ROLE_LABEL

__all__ = [
    "DECIDERS",
    "PD_CONFIG_TEXT",
    "PREFILL_SUFFIX",
    "ROLES",
    "Fleet",
    "SetsRequestHeaders",
    "pd_config",
    "prefiller_of",
    "role_labels",
]

ROLES = ("", "prefill", "decode", "both")
PREFILL_SUFFIX = "/prefill"  # the prefill leg's engine request id: the request's id plus this


def role_labels(role: str) -> dict[str, str]:
    """The endpoint labels of an engine with ``role`` ("" is an ordinary, aggregated endpoint)."""
    return {ROLE_LABEL: role} if role else {}


def prefiller_of(headers: Mapping[str, str]) -> str:
    """The first ``host:port`` of ``x-prefiller-host-port`` ("" when the request is not disaggregated)."""
    value = headers.get(hdr.PREFILLER, "")
    return next((p.strip() for p in value.split(",") if p.strip()), "")


@runtime_checkable
class SetsRequestHeaders(Protocol):
    """A policy whose decision may carry headers for the upstream request (picker's scheduler does)."""

    def request_headers(self, req: InferenceRequest, pick: Any) -> Mapping[str, str]: ...


# llm-d's P/D sample (pd-epp-config.yaml, reference/scheduling.md §2), as shipped.
PD_CONFIG_TEXT = """\
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
{decider}- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: {decider_type}
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""
DECIDERS = ("always", "prefix:N", "length:N")  # prefix:16 is the sample's own


def pd_config(decider: str = "prefix:16") -> str:
    """llm-d's P/D sample with a decider: ``always``, ``prefix:N`` (nonCachedTokens N), ``length:N`` (picker's
    prompt-length decider, minPromptTokens N)."""
    kind, _, arg = decider.strip().partition(":")
    if kind == "always" and not arg:
        always = "always-disagg-pd-decider"
        return PD_CONFIG_TEXT.format(decider=f"- type: {always}\n", decider_type=always)
    if kind in ("prefix", "length") and arg.isdigit():
        if kind == "prefix":
            block = f"- type: prefix-based-pd-decider\n  parameters:\n    nonCachedTokens: {int(arg)}\n"
            return PD_CONFIG_TEXT.format(decider=block, decider_type="prefix-based-pd-decider")
        block = f"- type: prompt-length-pd-decider\n  parameters:\n    minPromptTokens: {int(arg)}\n"
        return PD_CONFIG_TEXT.format(decider=block, decider_type="prompt-length-pd-decider")
    raise ValueError(f"decider {decider!r}: one of always, prefix:N, length:N")


_FLEET = re.compile(r"(?:(\d+)p)?(?:(\d+)d)?(?:(\d+)b)?\Z")


@dataclass(frozen=True, slots=True)
class Fleet:
    """Engine roles by position: ``Fleet.parse("2p6d")`` = 2 prefill then 6 decode; ``"8"`` = 8 without roles."""

    name: str
    roles: tuple[str, ...]

    @property
    def engines(self) -> int:
        return len(self.roles)

    @property
    def disaggregated(self) -> bool:
        return any(self.roles)

    @classmethod
    def parse(cls, spec: str) -> Fleet:
        spec = spec.strip().lower()
        if spec.isdigit():
            n = int(spec)
            if n < 1:
                raise ValueError("a fleet needs at least one engine")
            return cls(spec, ("",) * n)
        m = _FLEET.match(spec)
        if not spec or m is None:
            raise ValueError(f"fleet {spec!r}: write N (no roles) or e.g. 2p6d, 2p4d2b (p prefill, d decode, b both)")
        p, d, b = (int(x) if x else 0 for x in m.groups())
        if d + b < 1:
            raise ValueError(f"fleet {spec!r} has no engine that decodes")
        return cls(spec, ("prefill",) * p + ("decode",) * d + ("both",) * b)
