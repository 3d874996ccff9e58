"""EndpointPickerConfig: load, default, validate, instantiate (scheduling.md §2).

The YAML is the reference's (``inference.networking.x-k8s.io/v1alpha1`` or ``llm-d.ai/v1alpha1``,
``kind: EndpointPickerConfig``) and loads unchanged: ``plugins[]`` ``{name?, type, parameters?}``,
``schedulingProfiles[]`` ``{name, plugins[]: {pluginRef, weight?}}``, ``dataLayer`` (or ``data``),
``featureGates``, ``saturationDetector``, ``parser``, ``flowControl``; picker adds ``pluginIsolation``
(``budgetMs`` 5, ``disableAfterOverruns`` 5, ``cooldownMs`` 30000) and a plugin's ``budgetMs``, which apply to
user plugins only.

Defaults, as the reference: a plugin's name is its type; an unweighted scorer weighs 1.0; a profile without a
picker gets ``max-score-picker``; one profile and no handler ⇒ ``single-profile-handler``; no profiles ⇒ one
profile ``default`` with every filter, scorer and picker; parser ``openai-parser``. Unknown plugin types and bad
parameter values are ``ConfigError``s; unknown parameter keys are logged once and ignored.

A type that is not built in is a user plugin: ``package.module:ClassName`` or the name of an entry point in the
group ``picker.plugins`` (``external``); it is created wrapped in its isolation (``isolation``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.alias_generators import to_camel

from picker import errors
from picker.plugins.params import ParamsError, parse_params
from picker.scheduling import external, registry
from picker.scheduling.framework import Filter, Picker, PluginContext, ProfileHandler, Scorer
from picker.scheduling.isolation import DEFAULT_ISOLATION, Isolation
from picker.scheduling.plugins import max_score, parsers, single_profile
from picker.scheduling.profile import Profile, WeightedScorer
from picker.scheduling.spec import BindsPlugins, ConfiguredPlugin, PluginSpec

__all__ = [
    "API_VERSIONS",
    "DEFAULT_CONFIG_TEXT",
    "DataSource",
    "SchedulerConfig",
    "load_config",
    "load_config_file",
]

log = logging.getLogger(__name__)

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
KIND = "EndpointPickerConfig"
DEFAULT_PROFILE = "default"

# picker's built-in default: one file, read by ``picker serve`` without ``--config`` and rendered by the Helm chart
# (``deploy/helm/picker/files/default-plugins.yaml`` is a link to it). docs/scheduling.md says what it does and why.
DEFAULT_CONFIG_TEXT = (resources.files("picker.scheduling") / "default-plugins.yaml").read_text(encoding="utf-8")


@dataclass(frozen=True, slots=True)
class DataSource:
    """A ``dataLayer.sources[]`` entry: a source plugin and the plugins that consume what it produces."""

    plugin_ref: str
    extractors: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    profiles: Mapping[str, Profile]
    profile_handler: ProfileHandler
    # Every plugin by name: scheduling instances, and ConfiguredPlugin for data layer / detectors / parsers.
    plugins: Mapping[str, object]
    data_sources: tuple[DataSource, ...] = ()
    feature_gates: frozenset[str] = frozenset()
    saturation_detector: str | None = None  # plugin name (a ConfiguredPlugin of kind "saturation-detector")
    parser: str = parsers.OPENAI  # parser type, accepted by picker.request.parse.parse_request(parser=...)
    flow_control: Mapping[str, Any] = field(default_factory=dict)
    api_version: str = API_VERSIONS[0]
    source: str = "built-in default"
    isolation: Isolation = DEFAULT_ISOLATION  # the defaults of user plugins (pluginIsolation)

    def configured(self, kind: str) -> list[ConfiguredPlugin]:
        """The non-scheduling plugins of one kind ("data-source", "extractor", "saturation-detector", "parser")."""
        return [p for p in self.plugins.values() if isinstance(p, ConfiguredPlugin) and p.kind == kind]

    def feature(self, gate: str) -> bool:
        return gate in self.feature_gates


def load_config(text: str | None, ctx: PluginContext) -> SchedulerConfig:
    """Build a configuration from YAML text; ``None`` ⇒ picker's built-in default."""
    if text is None:
        return _build(DEFAULT_CONFIG_TEXT, ctx, "built-in default")
    return _build(text, ctx, "config text")


def load_config_file(path: str, ctx: PluginContext) -> SchedulerConfig:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise errors.ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    return _build(text, ctx, path)


# -- the document schema -------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="ignore")


class _PluginDecl(_Model):
    name: str | None = Field(default=None, min_length=1)
    type: str = Field(min_length=1)
    parameters: dict[str, Any] | None = None
    budget_ms: float | None = Field(default=None, gt=0.0)  # picker's: a user plugin's time budget per call


class _ProfilePluginDecl(_Model):
    plugin_ref: str
    weight: float | None = Field(default=None, ge=0.0)


class _ProfileDecl(_Model):
    name: str = Field(min_length=1)
    plugins: list[_ProfilePluginDecl] = []


class _RefDecl(_Model):
    plugin_ref: str


class _SourceDecl(_Model):
    plugin_ref: str
    extractors: list[_RefDecl] = []


class _DataLayerDecl(_Model):
    sources: list[_SourceDecl] = []


class _IsolationDecl(_Model):
    budget_ms: float = Field(default=DEFAULT_ISOLATION.budget_s * 1e3, gt=0.0)
    disable_after_overruns: int = Field(default=DEFAULT_ISOLATION.disable_after_overruns, ge=0)
    cooldown_ms: float = Field(default=DEFAULT_ISOLATION.cooldown_s * 1e3, ge=0.0)

    def isolation(self) -> Isolation:
        return Isolation(self.budget_ms / 1e3, self.disable_after_overruns, self.cooldown_ms / 1e3)


class _Document(_Model):
    api_version: str
    kind: str
    plugins: list[_PluginDecl] = []
    scheduling_profiles: list[_ProfileDecl] = []
    data_layer: _DataLayerDecl | None = None
    data: _DataLayerDecl | None = None  # the reference doc page's name for dataLayer
    feature_gates: list[str] = []  # also accepted as a mapping of gate -> bool
    saturation_detector: _RefDecl | None = None
    parser: _RefDecl | None = None
    flow_control: dict[str, Any] | None = None
    plugin_isolation: _IsolationDecl | None = None

    @field_validator("feature_gates", mode="before")
    @classmethod
    def _gates(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return [str(k) for k, enabled in value.items() if enabled]
        return [] if value is None else value


_DOCUMENT_KEYS = frozenset({f.alias or n for n, f in _Document.model_fields.items()} | set(_Document.model_fields))


# -- building -----------------------------------------------------------------------------------------------


def _build(text: str, ctx: PluginContext, source: str) -> SchedulerConfig:
    doc = _parse(text, source)
    isolation = doc.plugin_isolation.isolation() if doc.plugin_isolation else DEFAULT_ISOLATION
    plugins = _instantiate(doc.plugins, ctx, isolation, source)
    profiles = _profiles(doc.scheduling_profiles, plugins, ctx, source)
    _bind(plugins, profiles, source)
    handler = _handler(plugins, profiles, source)
    data_layer = doc.data_layer or doc.data
    data_sources = tuple(
        DataSource(s.plugin_ref, tuple(e.plugin_ref for e in s.extractors))
        for s in (data_layer.sources if data_layer else [])
    )
    for ds in data_sources:
        for ref in (ds.plugin_ref, *ds.extractors):
            _require(plugins, ref, "dataLayer.sources", source)
    detector = None
    if doc.saturation_detector is not None:
        detector = doc.saturation_detector.plugin_ref
        _require_kind(plugins, detector, "saturation-detector", "saturationDetector", source)
    parser = parsers.OPENAI
    if doc.parser is not None:
        parser_plugin = _require_kind(plugins, doc.parser.plugin_ref, "parser", "parser", source)
        parser = parser_plugin.type
    return SchedulerConfig(
        profiles=MappingProxyType(profiles),
        profile_handler=handler,
        plugins=MappingProxyType(plugins),
        data_sources=data_sources,
        feature_gates=frozenset(doc.feature_gates),
        saturation_detector=detector,
        parser=parser,
        flow_control=MappingProxyType(dict(doc.flow_control or {})),
        api_version=doc.api_version,
        source=source,
        isolation=isolation,
    )


def _parse(text: str, source: str) -> _Document:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.ConfigError(f"{source}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise errors.ConfigError(f"{source}: expected an EndpointPickerConfig mapping, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in _DOCUMENT_KEYS)
    if unknown:
        log.warning("%s: ignoring unknown EndpointPickerConfig keys: %s", source, ", ".join(unknown))
    try:
        doc = _Document.model_validate(raw)
    except ValidationError as exc:
        raise errors.ConfigError(f"{source}: invalid EndpointPickerConfig: {_describe(exc)}") from exc
    if doc.api_version not in API_VERSIONS:
        raise errors.ConfigError(
            f"{source}: unsupported apiVersion {doc.api_version!r}; expected one of {', '.join(API_VERSIONS)}"
        )
    if doc.kind != KIND:
        raise errors.ConfigError(f"{source}: unsupported kind {doc.kind!r}; expected {KIND}")
    return doc


def _instantiate(decls: list[_PluginDecl], ctx: PluginContext, isolation: Isolation, source: str) -> dict[str, object]:
    plugins: dict[str, object] = {}
    for decl in decls:
        name = decl.name or decl.type
        if name in plugins:
            raise errors.ConfigError(f"{source}: duplicate plugin name {name!r}")
        spec = registry.lookup(decl.type)
        if spec is not None:
            if decl.budget_ms is not None:
                log.warning("%s: plugin %r (%s): budgetMs applies to user plugins only", source, name, decl.type)
            plugins[name] = _create(spec, name, decl.parameters, ctx, source)
            continue
        where = f"{source}: plugin {name!r}" + (f" (type {decl.type!r})" if name != decl.type else "")
        user = external.resolve(decl.type, where)
        if user is None:
            raise errors.ConfigError(
                f"{source}: unknown plugin type {decl.type!r} (plugin {name!r}); known types: "
                + ", ".join(registry.known_types())
                + _installed_note()
            )
        budget_s = decl.budget_ms / 1e3 if decl.budget_ms is not None else None
        plugin, ignored = external.create(user, name, decl.parameters, ctx, isolation, budget_s, where)
        if ignored:
            log.warning("%s: ignoring unknown parameters: %s", where, ", ".join(ignored))
        log.info("%s: user %s from %s", where, user.role.lower(), user.origin)
        plugins[name] = plugin
    return plugins


def _installed_note() -> str:
    installed = external.installed_types()
    listed = f"installed plugin types: {', '.join(installed)}" if installed else "no plugin packages installed"
    return f"; {listed}; a user plugin class is named 'package.module:ClassName'"


def _create(spec: PluginSpec[Any], name: str, raw: Mapping[str, Any] | None, ctx: PluginContext, source: str) -> object:
    try:
        params, ignored = parse_params(spec.params, raw)
    except ParamsError as exc:
        raise errors.ConfigError(f"{source}: plugin {name!r} ({spec.type}): invalid parameters: {exc}") from exc
    if ignored:
        log.warning("%s: plugin %r (%s): ignoring unknown parameters: %s", source, name, spec.type, ", ".join(ignored))
    return spec.create(name, params, ctx)


def _profiles(
    decls: list[_ProfileDecl], plugins: dict[str, object], ctx: PluginContext, source: str
) -> dict[str, Profile]:
    default_picker: Picker | None = None

    def fallback_picker() -> Picker:
        nonlocal default_picker
        if default_picker is None:
            existing = plugins.get(max_score.TYPE)
            if isinstance(existing, Picker):
                default_picker = existing
            else:
                default_picker = max_score.create(max_score.TYPE, max_score.Params(), ctx)
        return default_picker

    if not decls:  # one profile with every filter, scorer and picker
        refs = [_ProfilePluginDecl(plugin_ref=n) for n, p in plugins.items() if isinstance(p, Filter | Scorer | Picker)]
        decls = [_ProfileDecl(name=DEFAULT_PROFILE, plugins=refs)]

    profiles: dict[str, Profile] = {}
    for decl in decls:
        if decl.name in profiles:
            raise errors.ConfigError(f"{source}: duplicate scheduling profile {decl.name!r}")
        filters: list[Filter] = []
        scorers: list[WeightedScorer] = []
        picker: Picker | None = None
        where = f"scheduling profile {decl.name!r}"
        for ref in decl.plugins:
            plugin = _require(plugins, ref.plugin_ref, where, source)
            # Check the role by class attributes: a plugin may implement several protocols (e.g. a scorer that
            # is also a PreRequest hook), but exactly one scheduling role.
            if isinstance(plugin, Scorer):
                scorers.append(WeightedScorer(plugin, 1.0 if ref.weight is None else ref.weight))
                continue
            if ref.weight is not None:
                log.warning("%s: %s: weight of %r ignored: it is not a scorer", source, where, ref.plugin_ref)
            if isinstance(plugin, Filter):
                filters.append(plugin)
            elif isinstance(plugin, Picker):
                if picker is not None:
                    raise errors.ConfigError(
                        f"{source}: {where} has two pickers: {picker.name!r} and {ref.plugin_ref!r}"
                    )
                picker = plugin
            else:
                raise errors.ConfigError(
                    f"{source}: {where} refers to {ref.plugin_ref!r} ({_type_of(plugin)}), "
                    "which is not a filter, scorer or picker"
                )
        profiles[decl.name] = Profile(decl.name, filters, scorers, picker or fallback_picker())
    return profiles


def _bind(plugins: Mapping[str, object], profiles: Mapping[str, Profile], source: str) -> None:
    """Resolve the plugins that name other plugins or profiles (a P/D handler's deciders and profiles)."""
    for name, plugin in plugins.items():
        if isinstance(plugin, BindsPlugins):
            try:
                plugin.bind(plugins, tuple(profiles))
            except ValueError as exc:
                raise errors.ConfigError(f"{source}: plugin {name!r} ({_type_of(plugin)}): {exc}") from exc


def _handler(plugins: Mapping[str, object], profiles: Mapping[str, Profile], source: str) -> ProfileHandler:
    handlers = [p for p in plugins.values() if isinstance(p, ProfileHandler)]
    if len(handlers) > 1:
        names = ", ".join(repr(h.name) for h in handlers)
        raise errors.ConfigError(f"{source}: more than one profile handler: {names}")
    handler: ProfileHandler = handlers[0] if handlers else single_profile.SingleProfileHandler(single_profile.TYPE)
    if handler.type == single_profile.TYPE and len(profiles) != 1:
        raise errors.ConfigError(
            f"{source}: {single_profile.TYPE} runs exactly one scheduling profile; "
            f"{len(profiles)} are configured ({', '.join(profiles)}); configure a profile handler for them"
        )
    return handler


def _require(plugins: Mapping[str, object], ref: str, where: str, source: str) -> object:
    plugin = plugins.get(ref)
    if plugin is None:
        raise errors.ConfigError(
            f"{source}: {where} refers to plugin {ref!r}, which is not declared in plugins "
            f"(declared: {', '.join(plugins) or 'none'})"
        )
    return plugin


def _require_kind(plugins: Mapping[str, object], ref: str, kind: str, where: str, source: str) -> ConfiguredPlugin:
    plugin = _require(plugins, ref, where, source)
    if not isinstance(plugin, ConfiguredPlugin) or plugin.kind != kind:
        raise errors.ConfigError(f"{source}: {where} refers to {ref!r} ({_type_of(plugin)}), which is not a {kind}")
    return plugin


def _type_of(plugin: object) -> str:
    return str(getattr(plugin, "type", type(plugin).__name__))


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
