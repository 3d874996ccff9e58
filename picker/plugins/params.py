"""Typed plugin parameters: a pydantic model or a dataclass, validated once when the config loads.

A plugin's ``parameters:`` mapping becomes an instance of its parameters class:

* a ``PluginParams`` subclass (a frozen pydantic model; keys are camelCase in YAML, snake_case in Python) —
  what the built-in plugins use; any other pydantic ``BaseModel`` is validated by its own field names/aliases;
* a ``dataclass``: validated by pydantic too (``"5"`` for an ``int`` field is accepted, ``"x"`` is not); a
  camelCase key fills the snake_case field of the same name (``headerName`` → ``header_name``).

Unknown keys are returned to the caller, which logs them once and ignores them (reference configs carry keys
picker does not know). A value that does not validate is a ``ParamsError``, which the loader reports as a
``ConfigError`` naming the plugin.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel, to_snake

__all__ = ["NoParams", "ParamsError", "ParsedParams", "PluginParams", "describe", "is_params_type", "parse_params"]


class PluginParams(BaseModel):
    """Plugin parameters: frozen, camelCase in YAML (``maxNumOfEndpoints``), snake_case in Python.

    Unknown keys are ignored here; the loader warns about them once.
    """

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True, extra="ignore")


class NoParams(PluginParams):
    """For plugins that take no parameters."""


class ParamsError(ValueError):
    """The parameters do not validate; the message says which key and why."""


class ParsedParams(NamedTuple):
    value: Any  # an instance of the parameters class
    ignored: list[str]  # keys the class does not know, in input order


def is_params_type(cls: object) -> bool:
    """A pydantic model class or a dataclass type."""
    return isinstance(cls, type) and (issubclass(cls, BaseModel) or dataclasses.is_dataclass(cls))


def parse_params(cls: type[Any], raw: Mapping[str, Any] | None) -> ParsedParams:
    """Validate ``raw`` into an instance of ``cls`` (see the module docstring). Raises ``ParamsError``."""
    raw = raw or {}
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        return _pydantic(cls, raw)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        return _dataclass(cls, raw)
    raise ParamsError(f"{cls!r} is neither a pydantic model nor a dataclass")


def _pydantic(cls: type[BaseModel], raw: Mapping[str, Any]) -> ParsedParams:
    accepted = set(cls.model_fields)
    accepted.update(f.alias for f in cls.model_fields.values() if f.alias)
    ignored = [str(k) for k in raw if k not in accepted]
    try:
        return ParsedParams(cls.model_validate(dict(raw)), ignored)
    except ValidationError as exc:
        raise ParamsError(describe(exc)) from exc


def _dataclass(cls: type[Any], raw: Mapping[str, Any]) -> ParsedParams:
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    data: dict[str, Any] = {}
    ignored: list[str] = []
    for key, value in raw.items():
        name = str(key)
        if name not in fields:
            name = to_snake(name)
        if name not in fields:
            ignored.append(str(key))
            continue
        if name in data:
            raise ParamsError(f"{key}: given twice (as {name!r} and in camelCase)")
        data[name] = value
    try:
        return ParsedParams(TypeAdapter(cls).validate_python(data), ignored)
    except ValidationError as exc:
        raise ParamsError(describe(exc)) from exc


def describe(exc: ValidationError) -> str:
    """One line per error: ``location: message``."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)
