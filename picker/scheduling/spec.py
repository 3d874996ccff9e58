"""PluginSpec: how the config loader builds a plugin from its type name, and the base of plugin parameters.

Every plugin module defines ``TYPE``, ``Params`` (a ``PluginParams``), ``create(name, params, ctx)`` and
``SPEC = PluginSpec(TYPE, Params, create)``; ``registry.py`` lists the specs in one explicit table.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

from picker.scheduling.framework import PluginContext

__all__ = ["ConfiguredPlugin", "NoParams", "PluginParams", "PluginSpec"]


class PluginParams(BaseModel):
    """Plugin parameters: frozen, camelCase in YAML (``maxNumOfEndpoints``), snake_case in Python.

    Unknown keys are ignored here; the loader warns about them once.
    """

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="ignore")


class NoParams(PluginParams):
    """For plugins that take no parameters."""


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
