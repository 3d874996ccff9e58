"""PluginSpec: how the config loader builds a built-in plugin from its type name.

Every plugin module defines ``TYPE``, ``Params`` (a ``PluginParams``), ``create(name, params, ctx)`` and
``SPEC = PluginSpec(TYPE, Params, create)``; ``registry.py`` lists the specs in one explicit table.
``PluginParams`` (the parameters base, from the public ``picker.plugins`` API) is re-exported here.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, runtime_checkable

from picker.plugins.api import PluginContext
from picker.plugins.params import NoParams, PluginParams

__all__ = ["BindsPlugins", "ConfiguredPlugin", "NoParams", "PluginParams", "PluginSpec"]


P = TypeVar("P", bound=PluginParams)


@dataclass(frozen=True, slots=True)
class PluginSpec(Generic[P]):
    type: str  # the reference type name, e.g. "queue-scorer"
    params: builtins.type[P]
    create: Callable[[str, P, PluginContext], object]
    # "scheduling" for framework plugins; otherwise the ConfiguredPlugin kind create() returns.
    kind: str = "scheduling"


@dataclass(frozen=True, slots=True)
class ConfiguredPlugin:
    """A plugin with no scheduling role (data layer, saturation detector, parser): its typed parameters, kept
    for the package that acts on them."""

    type: str
    name: str
    params: PluginParams
    kind: str  # "data-source", "extractor", "saturation-detector", "parser"


@runtime_checkable
class BindsPlugins(Protocol):
    """A plugin that refers to other plugins or to profiles by name (e.g. a profile handler and its deciders).

    The loader calls ``bind`` once every plugin and profile exists; a ``ValueError`` (naming what is missing or
    wrong) becomes a ``ConfigError`` naming the plugin."""

    def bind(self, plugins: Mapping[str, object], profiles: Collection[str]) -> None: ...
