"""The ``flowControl`` section of an EndpointPickerConfig: capacities, TTLs, per-band policies (scheduling.md §9).

Read only when ``featureGates`` has ``flowControl``. Keys, as the reference writes them::

    flowControl:
      maxBytes: 0              # global; a quantity ("2Gi"); 0 or absent = unlimited
      maxRequests: 0           # global; 0 or absent = unlimited
      defaultRequestTTL: "0s"  # how long a request may wait; 0 or absent = until the client goes away
      usageLimitPolicyPluginRef: <a static-usage-limit-policy plugin>   # the ceiling (default 1.0)
      defaultPriorityBand:     # the template of every band
        maxBytes: "1Gi"        # per band (reference default 1 GB); 0 = unlimited
        maxRequests: 0
        fairnessPolicyRef: global-strict-fairness-policy
        orderingPolicyRef: fcfs-ordering-policy
      priorityBands:           # overrides, by priority; unset fields inherit from defaultPriorityBand
      - {priority: 100, maxRequests: 500, fairnessPolicyRef: round-robin-fairness-policy, defaultRequestTTL: 30s}

A policy ref names a plugin declared in ``plugins[]`` (its name; by default its type) or, undeclared, a policy
type. Unknown keys are logged once and ignored; bad values are ``ConfigError``s.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from picker import errors
from picker.scheduling.plugins import flow_policies as fp
from picker.scheduling.spec import ConfiguredPlugin
from picker.scheduling.units import duration_s, quantity

__all__ = ["DEFAULT_BAND_MAX_BYTES", "BandConfig", "FlowConfig", "parse_flow_config"]

log = logging.getLogger(__name__)

DEFAULT_BAND_MAX_BYTES = 1_000_000_000
_FAIRNESS_TYPES = frozenset({fp.GLOBAL_STRICT, fp.ROUND_ROBIN})
_ORDERING_TYPES = frozenset({fp.FCFS, fp.EDF, fp.SLO_DEADLINE})


@dataclass(frozen=True, slots=True)
class BandConfig:
    max_bytes: int | None = DEFAULT_BAND_MAX_BYTES  # None: unlimited
    max_requests: int | None = None
    fairness: str = fp.GLOBAL_STRICT
    ordering: str = fp.FCFS
    ttl_s: float | None = None  # None: the global default TTL


@dataclass(frozen=True, slots=True)
class FlowConfig:
    max_bytes: int | None = None
    max_requests: int | None = None
    default_ttl_s: float | None = None  # None: wait until dispatched or the client goes away
    ceiling: float = 1.0  # dispatch only while saturation is below this
    default_band: BandConfig = field(default_factory=BandConfig)
    bands: Mapping[int, BandConfig] = field(default_factory=lambda: MappingProxyType({}))

    def band(self, priority: int) -> BandConfig:
        return self.bands.get(priority, self.default_band)

    def ttl_s(self, priority: int) -> float | None:
        band_ttl = self.band(priority).ttl_s
        return band_ttl if band_ttl is not None else self.default_ttl_s


# -- the document schema -------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="allow")


def _limit(value: Any) -> int | None:
    if value is None:
        return None
    amount = quantity(value)
    return amount or None  # 0 = unlimited


def _ttl(value: Any) -> float | None:
    if value is None:
        return None
    seconds = duration_s(value)
    return seconds or None  # 0 = no TTL


class _BandDecl(_Model):
    priority: int | None = None
    max_bytes: Any = None
    max_requests: Any = None
    fairness_policy_ref: str | None = None
    ordering_policy_ref: str | None = None
    default_request_ttl: Any = Field(default=None, alias="defaultRequestTTL")

    @field_validator("max_bytes", "max_requests")
    @classmethod
    def _quantity(cls, value: Any) -> Any:
        return None if value is None else quantity(value)

    @field_validator("default_request_ttl")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else duration_s(value)


class _FlowDecl(_Model):
    max_bytes: Any = None
    max_requests: Any = None
    default_request_ttl: Any = Field(default=None, alias="defaultRequestTTL")
    usage_limit_policy_plugin_ref: str | None = None
    default_priority_band: _BandDecl | None = None
    priority_bands: list[_BandDecl] = []

    @field_validator("max_bytes", "max_requests")
    @classmethod
    def _quantity(cls, value: Any) -> Any:
        return None if value is None else quantity(value)

    @field_validator("default_request_ttl")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        return None if value is None else duration_s(value)


# -- building -----------------------------------------------------------------------------------------------


def parse_flow_config(
    raw: Mapping[str, Any] | None, plugins: Mapping[str, object], *, source: str = "config"
) -> FlowConfig:
    """The flow-control settings of a configuration. Raises ``errors.ConfigError``."""
    try:
        decl = _FlowDecl.model_validate(dict(raw or {}))
    except ValidationError as exc:
        raise errors.ConfigError(f"{source}: invalid flowControl: {_describe(exc)}") from exc
    _warn_unknown(decl, "flowControl", source)
    template = BandConfig()
    if decl.default_priority_band is not None:
        _warn_unknown(decl.default_priority_band, "flowControl.defaultPriorityBand", source)
        template = _band(decl.default_priority_band, template, plugins, source)
    bands: dict[int, BandConfig] = {}
    for i, band in enumerate(decl.priority_bands):
        _warn_unknown(band, f"flowControl.priorityBands[{i}]", source)
        if band.priority is None:
            raise errors.ConfigError(f"{source}: flowControl.priorityBands[{i}] has no priority")
        if band.priority in bands:
            raise errors.ConfigError(f"{source}: flowControl.priorityBands: priority {band.priority} given twice")
        bands[band.priority] = _band(band, template, plugins, source)
    return FlowConfig(
        max_bytes=decl.max_bytes or None,
        max_requests=decl.max_requests or None,
        default_ttl_s=decl.default_request_ttl or None,
        ceiling=_ceiling(decl.usage_limit_policy_plugin_ref, plugins, source),
        default_band=template,
        bands=MappingProxyType(bands),
    )


def _band(decl: _BandDecl, base: BandConfig, plugins: Mapping[str, object], source: str) -> BandConfig:
    return BandConfig(
        max_bytes=base.max_bytes if decl.max_bytes is None else (decl.max_bytes or None),
        max_requests=base.max_requests if decl.max_requests is None else (decl.max_requests or None),
        fairness=(
            base.fairness
            if decl.fairness_policy_ref is None
            else _policy(decl.fairness_policy_ref, fp.FAIRNESS, _FAIRNESS_TYPES, plugins, source)
        ),
        ordering=(
            base.ordering
            if decl.ordering_policy_ref is None
            else _policy(decl.ordering_policy_ref, fp.ORDERING, _ORDERING_TYPES, plugins, source)
        ),
        ttl_s=base.ttl_s if decl.default_request_ttl is None else (decl.default_request_ttl or None),
    )


def _policy(ref: str, kind: str, types: frozenset[str], plugins: Mapping[str, object], source: str) -> str:
    plugin = plugins.get(ref)
    if isinstance(plugin, ConfiguredPlugin) and plugin.kind == kind:
        return plugin.type
    if plugin is None and ref in types:
        return ref
    raise errors.ConfigError(
        f"{source}: flowControl refers to {ref!r}, which is not a {kind} (declare one of: {', '.join(sorted(types))})"
    )


def _ceiling(ref: str | None, plugins: Mapping[str, object], source: str) -> float:
    limits = [p for p in plugins.values() if isinstance(p, ConfiguredPlugin) and p.kind == fp.USAGE_LIMIT]
    if ref is not None:
        named = plugins.get(ref)
        if not (isinstance(named, ConfiguredPlugin) and named.kind == fp.USAGE_LIMIT):
            raise errors.ConfigError(f"{source}: flowControl.usageLimitPolicyPluginRef {ref!r} is not declared")
        limits = [named]
    if len(limits) > 1:
        raise errors.ConfigError(f"{source}: several usage-limit policies; name one in usageLimitPolicyPluginRef")
    if not limits:
        return 1.0
    params = limits[0].params
    return params.threshold if isinstance(params, fp.UsageLimitParams) else 1.0


def _warn_unknown(model: BaseModel, where: str, source: str) -> None:
    extra = model.model_extra or {}
    if extra:
        log.warning("%s: %s: ignoring unknown keys: %s", source, where, ", ".join(sorted(map(str, extra))))


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
