"""disagg-profile-handler (llm-d): prefill/decode (and encode) disaggregation, one request in two profiles.

Types ``disagg-profile-handler`` and its legacy alias ``pd-profile-handler``. Per request:

1. run the ``decode`` profile (every candidate the decode profile's filters keep; an endpoint without the
   ``llm-d.ai/role`` label decodes). No target ⇒ the request fails (429, ``failed to find target endpoint``).
2. if an ``encode`` profile exists and the encode decider says yes for the chosen decode endpoint, run it;
3. if a ``prefill`` profile exists and the prefill decider says yes for the chosen decode endpoint (the
   ``prefix-based-pd-decider`` reads what that endpoint already caches), run it. A prefill profile that finds
   no endpoint (no healthy prefill pod) is no error: the request is served decode-only, as aggregated.
4. the decode profile is primary: its targets are the destination. The handler sets, on the request routed
   there, ``x-prefiller-host-port: ip:port`` (the prefill result's first target) and ``x-encoder-hosts-ports``
   (``disagg_headers``); the decode pod's routing sidecar sends the prefill first (docs/disaggregation.md).

Each decision is counted in ``llm_d_inference_scheduler_disagg_decision_total{model_name, decision_type}``.

Parameters (llm-d ≥ 0.9): ``profiles`` {``decode`` "decode", ``prefill`` "prefill", ``encode`` "encode"} and
``deciders`` {``prefill``, ``encode``}: plugin names of deciders (``pd_deciders``). Without ``deciders.prefill``
disaggregation is off (every request decode-only), as llm-d. The older flat parameters ``decodeProfile``,
``prefillProfile``, ``encodeProfile``, ``prefillDeciderPluginName``, ``encodeDeciderPluginName`` and
``deciderPluginName`` are accepted too (not mixed with the nested ones). ``prefixPluginType`` /
``prefixPluginName`` are accepted and unused (the decider reads the prefix match the decode profile's prefix
plugin left in the cycle). ``primaryPort`` (the deprecated data-parallel rewrite) is refused: picker routes
data-parallel ranks as ordinary endpoints.

``pd-profile-handler``, the older handler, takes the flat parameters plus ``threshold`` and ``hashBlockSize``:
with ``deciderPluginName`` it uses that decider; else, with ``threshold`` T > 0, it disaggregates unless the
decode endpoint's uncached share of the prompt is short: (1 - hit%) x prompt characters < T, hit% = (matched
blocks - 1) x block characters / prompt characters (its original rule; T = 0, the shipped value, always
disaggregates); without either it always disaggregates (its default decider was ``always-disagg-pd-decider``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from picker.plugins import CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams, ProfileResult
from picker.plugins import SchedulingResult as Result
from picker.scheduling.framework import ProfileHandler
from picker.scheduling.plugins.disagg_headers import disagg_headers
from picker.scheduling.plugins.pd_deciders import Decider
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from picker.scheduling.spec import PluginSpec
from picker.telemetry import disagg as metrics

__all__ = [
    "LEGACY_SPEC",
    "LEGACY_TYPE",
    "SPEC",
    "TYPE",
    "DisaggProfileHandler",
    "LegacyParams",
    "Params",
    "create",
]

log = logging.getLogger(__name__)

TYPE = "disagg-profile-handler"
LEGACY_TYPE = "pd-profile-handler"
_DONE = "disagg-profile-handler/done"  # CycleState: the decision of this cycle was counted


_FLAT = (
    "decode_profile",
    "prefill_profile",
    "encode_profile",
    "prefill_decider_plugin_name",
    "encode_decider_plugin_name",
    "decider_plugin_name",
)


class _Nested(BaseModel):
    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="ignore")


class Profiles(_Nested):
    decode: str = ""
    prefill: str = ""
    encode: str = ""


class Deciders(_Nested):
    prefill: str = ""
    encode: str = ""


class Params(PluginParams):
    profiles: Profiles | None = None
    deciders: Deciders | None = None
    # the flat form (llm-d < 0.9), still accepted
    decode_profile: str = ""
    prefill_profile: str = ""
    encode_profile: str = ""
    prefill_decider_plugin_name: str = ""
    encode_decider_plugin_name: str = ""
    decider_plugin_name: str = ""
    # accepted, unused (module docstring)
    prefix_plugin_type: str = ""
    prefix_plugin_name: str = ""
    primary_port: int = Field(default=0, ge=0, le=65535)

    @model_validator(mode="after")
    def _one_form(self) -> Params:
        flat = [f for f in _FLAT if getattr(self, f)]
        if flat and (self.profiles is not None or self.deciders is not None):
            raise ValueError(
                "cannot mix the flat parameters (decodeProfile, prefillProfile, encodeProfile, deciderPluginName, "
                "prefillDeciderPluginName, encodeDeciderPluginName) with the nested ones (profiles, deciders)"
            )
        if self.primary_port:
            raise ValueError(
                "primaryPort (the deprecated data-parallel port rewrite) is not supported: list each rank's port "
                "as an endpoint of the pool instead"
            )
        return self


class LegacyParams(Params):
    threshold: int | None = Field(default=None, ge=0)
    hash_block_size: int = Field(default=0, ge=0)


class _ThresholdDecider:
    """pd-profile-handler's original rule (module docstring)."""

    name = "threshold"

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold

    def decide(self, req: InferenceRequest, decode: Endpoint, cycle: CycleState) -> bool:
        if self.threshold <= 0:
            return True
        text = req.prompt_text
        size = len(text) if text.isascii() else len(text.encode())
        if size == 0:
            return False
        match = cycle.get(MATCH_STATE)
        hit_chars = 0
        if isinstance(match, PrefixMatch):
            hit_chars = max(match.blocks.get(decode.key, 0) - 1, 0) * match.block_chars
        hit = min(1.0, hit_chars / size)
        return (1.0 - hit) * size >= self.threshold


class _Always:
    name = "always"

    def decide(self, req: InferenceRequest, decode: Endpoint, cycle: CycleState) -> bool:
        return True


class DisaggProfileHandler:
    __slots__ = (
        "_decider_names",
        "_has_encode",
        "_has_prefill",
        "decode",
        "encode",
        "encode_decider",
        "name",
        "prefill",
        "prefill_decider",
        "type",
    )

    def __init__(self, name: str, params: Params, type_name: str = TYPE) -> None:
        self.name = name
        self.type = type_name
        profiles = params.profiles or Profiles()
        deciders = params.deciders or Deciders()
        self.decode = profiles.decode or params.decode_profile or "decode"
        self.prefill = profiles.prefill or params.prefill_profile or "prefill"
        self.encode = profiles.encode or params.encode_profile or "encode"
        prefill_decider = deciders.prefill or params.prefill_decider_plugin_name or params.decider_plugin_name
        self._decider_names = (prefill_decider, deciders.encode or params.encode_decider_plugin_name)
        self.prefill_decider: Decider | None = None
        self.encode_decider: Decider | None = None
        self._has_prefill = self._has_encode = False
        if isinstance(params, LegacyParams) and not prefill_decider:
            self.prefill_decider = _ThresholdDecider(params.threshold) if params.threshold is not None else _Always()

    def bind(self, plugins: Mapping[str, object], profiles: Collection[str]) -> None:
        """Resolve the deciders by plugin name and check the decode profile exists (config loading)."""
        if self.decode not in profiles:
            raise ValueError(f"the decode profile {self.decode!r} is not configured (profiles: {', '.join(profiles)})")
        for stage, wanted in zip(("prefill", "encode"), self._decider_names, strict=True):
            if not wanted:
                continue
            plugin = plugins.get(wanted)
            if plugin is None:
                raise ValueError(f"deciders.{stage} names plugin {wanted!r}, which is not declared")
            if not isinstance(plugin, Decider):
                raise ValueError(f"deciders.{stage} names plugin {wanted!r}, which is not a decider")
            setattr(self, f"{stage}_decider", plugin)
        self._has_prefill = self.prefill in profiles
        self._has_encode = self.encode in profiles
        who = f"{self.name} ({self.type})"
        if self.prefill_decider is None:
            log.info("%s: no deciders.prefill configured: prefill/decode disaggregation disabled", who)
        elif not self._has_prefill:
            log.warning("%s: no %r profile: every request is served decode-only", who, self.prefill)

    def pick_profiles(
        self,
        req: InferenceRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileResult | None],
        cycle: CycleState,
    ) -> Sequence[str]:
        if self.decode not in results:
            return (self.decode,)
        decoded = results[self.decode]
        if decoded is None or not decoded.targets:
            return ()
        target = decoded.targets[0]
        encode = self.encode_decider if self._has_encode and self.encode not in results else None
        if encode is not None and encode.decide(req, target, cycle):
            return (self.encode,)
        prefill = self.prefill_decider if self._has_prefill and self.prefill not in results else None
        if prefill is not None and prefill.decide(req, target, cycle):
            return (self.prefill,)
        if _DONE not in cycle:
            cycle[_DONE] = True
            metrics.DISAGG_DECISIONS.labels(req.target_model, self._decision(results)).inc()
        return ()

    def primary(self, results: Mapping[str, ProfileResult | None]) -> str:
        return self.decode

    def request_headers(self, req: InferenceRequest, result: Result) -> Mapping[str, str]:
        return disagg_headers(result, self.prefill, self.encode)

    def _decision(self, results: Mapping[str, ProfileResult | None]) -> str:
        prefill = _served(results.get(self.prefill))
        encode = _served(results.get(self.encode))
        if encode:
            return metrics.ENCODE_PREFILL_DECODE if prefill else metrics.ENCODE_DECODE
        return metrics.PREFILL_DECODE if prefill else metrics.DECODE_ONLY


def _served(result: ProfileResult | None) -> bool:
    return result is not None and bool(result.targets)


def create(name: str, params: Params, ctx: PluginContext) -> ProfileHandler:
    return DisaggProfileHandler(name, params)


def _legacy(name: str, params: LegacyParams, ctx: PluginContext) -> ProfileHandler:
    return DisaggProfileHandler(name, params, LEGACY_TYPE)


SPEC = PluginSpec(TYPE, Params, create)
LEGACY_SPEC = PluginSpec(LEGACY_TYPE, LegacyParams, _legacy)
