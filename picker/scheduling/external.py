"""User plugins: a config ``type`` → a class, checked against the protocol, created, wrapped in isolation.

A type that is not built in names a user plugin, either

* ``package.module:ClassName`` (``module:Outer.Inner`` too), imported from picker's Python path; or
* a short name that an installed distribution registers in the entry-point group ``picker.plugins``
  (``[project.entry-points."picker.plugins"] label-affinity-scorer = "my_pkg:LabelAffinityScorer"``).
  Built-in names can't be overridden: they are looked up first.

The class (``picker.plugins`` documents the contract) has exactly one role method — ``score(req, endpoints,
cycle)``, ``filter(req, endpoints, cycle)`` or ``pick(scored, cycle)`` — and may also have the hooks
``pre_request``, ``post_response``, ``endpoints_changed``. Its constructor takes any of the keywords ``name``,
``params`` and ``ctx``. Its parameters class is the annotation of ``params`` (or a ``Params`` class attribute):
a pydantic model or a dataclass. A scorer may set ``category``. Every way this can go wrong — a missing module,
an import that fails, a missing attribute, a function where a class is expected, no or two role methods, a
method or constructor of the wrong shape, bad parameters, a constructor that raises — is an
``errors.ConfigError`` at startup naming the plugin and what to change.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from picker import errors
from picker.plugins import ENTRY_POINT_GROUP, api
from picker.plugins.api import Category, PluginContext
from picker.plugins.params import NoParams, ParamsError, is_params_type, parse_params
from picker.scheduling.isolation import Guard, GuardedFilter, GuardedPicker, GuardedPlugin, GuardedScorer, Isolation
from picker.scheduling.plugins import max_score

__all__ = ["CONSTRUCTOR_ARGS", "UserPluginClass", "create", "installed_types", "resolve"]

CONSTRUCTOR_ARGS = ("name", "params", "ctx")
DEFAULT_CATEGORY = Category.DISTRIBUTION


@dataclass(frozen=True, slots=True)
class _Role:
    method: str
    role: str  # the extension point name: Scorer, Filter, Picker
    args: tuple[str, ...]


_ROLES = (
    _Role("score", "Scorer", ("req", "endpoints", "cycle")),
    _Role("filter", "Filter", ("req", "endpoints", "cycle")),
    _Role("pick", "Picker", ("scored", "cycle")),
)


@dataclass(frozen=True, slots=True)
class UserPluginClass:
    """A user plugin class that passed the startup checks."""

    type_name: str  # as written in the config
    cls: type[Any]
    role: str  # "Scorer", "Filter" or "Picker"
    params_type: type[Any]
    init_args: frozenset[str]  # which of name / params / ctx the constructor takes
    category: Category
    origin: str  # where it came from, for messages


def installed_types() -> list[str]:
    """Names registered in the ``picker.plugins`` entry-point group by installed distributions."""
    return sorted({ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})


def resolve(type_name: str, where: str) -> UserPluginClass | None:
    """The checked class a type names; ``None`` when it is no ``module:Class`` path and no entry point."""
    if ":" in type_name:
        obj = _import(type_name, where)
        origin = f"module path {type_name}"
    else:
        found = _entry_point(type_name, where)
        if found is None:
            return None
        obj, origin = found
    return _check(obj, type_name, origin, where)


def create(
    resolved: UserPluginClass,
    name: str,
    raw_params: Mapping[str, Any] | None,
    ctx: PluginContext,
    isolation: Isolation,
    budget_s: float | None,
    where: str,
) -> tuple[GuardedPlugin, list[str]]:
    """Validate the parameters, create the plugin and wrap it. Returns it and the ignored parameter keys."""
    try:
        params, ignored = parse_params(resolved.params_type, raw_params)
    except ParamsError as exc:
        raise errors.ConfigError(f"{where}: invalid parameters: {exc}") from exc
    offered: dict[str, object] = {"name": name, "params": params, "ctx": ctx}
    kwargs = {k: v for k, v in offered.items() if k in resolved.init_args}
    try:
        instance = resolved.cls(**kwargs)
    except Exception as exc:
        raise errors.ConfigError(
            f"{where}: creating {resolved.cls.__qualname__} raised {type(exc).__name__}: {exc}"
        ) from exc
    guard = Guard(resolved.type_name, name, resolved.role, isolation, ctx.clock, budget_s=budget_s)
    plugin: GuardedPlugin
    if resolved.role == "Scorer":
        plugin = GuardedScorer(typing.cast(api.Scorer, instance), resolved.type_name, name, guard, resolved.category)
    elif resolved.role == "Filter":
        plugin = GuardedFilter(typing.cast(api.Filter, instance), resolved.type_name, name, guard)
    else:
        fallback = max_score.MaxScorePicker(f"{name}/fallback", 1, ctx.rng)
        plugin = GuardedPicker(typing.cast(api.Picker, instance), resolved.type_name, name, guard, fallback)
    return plugin, ignored


# -- resolution --------------------------------------------------------------------------------------------


def _import(type_name: str, where: str) -> object:
    module_name, _, attr_path = type_name.partition(":")
    if not module_name or not attr_path or any(not p.isidentifier() for p in attr_path.split(".")):
        raise errors.ConfigError(f"{where}: a plugin path is 'package.module:ClassName', not {type_name!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise errors.ConfigError(
                f"{where}: cannot import module {module_name!r}: no module named {missing!r} "
                "(install its distribution into picker's environment, or put it on PYTHONPATH)"
            ) from exc
        raise errors.ConfigError(f"{where}: importing module {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise errors.ConfigError(
            f"{where}: importing module {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    obj: object = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise errors.ConfigError(f"{where}: module {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def _entry_point(type_name: str, where: str) -> tuple[object, str] | None:
    found = metadata.entry_points(group=ENTRY_POINT_GROUP, name=type_name)
    # The same distribution may be visible twice on sys.path; only different targets are ambiguous.
    by_value = {ep.value: ep for ep in found}
    if not by_value:
        return None
    if len(by_value) > 1:
        owners = ", ".join(f"{v} ({_dist(ep)})" for v, ep in sorted(by_value.items()))
        raise errors.ConfigError(f"{where}: several installed distributions register {type_name!r}: {owners}")
    (ep,) = by_value.values()
    origin = f"entry point {type_name} = {ep.value} ({_dist(ep)})"
    try:
        return ep.load(), origin
    except Exception as exc:
        raise errors.ConfigError(f"{where}: loading {origin} raised {type(exc).__name__}: {exc}") from exc


def _dist(ep: metadata.EntryPoint) -> str:
    dist = ep.dist
    return f"distribution {dist.name} {dist.version}" if dist is not None else "unknown distribution"


# -- the protocol checks -----------------------------------------------------------------------------------


def _check(obj: object, type_name: str, origin: str, where: str) -> UserPluginClass:
    if not isinstance(obj, type):
        kind = "function" if inspect.isroutine(obj) else type(obj).__name__
        raise errors.ConfigError(f"{where}: {origin} is a {kind}, not a class")
    cls: type[Any] = obj
    qualname = cls.__qualname__
    roles = [r for r in _ROLES if callable(getattr(cls, r.method, None))]
    if not roles:
        wanted = "; ".join(f"{r.method}({', '.join(r.args)}) for a {r.role}" for r in _ROLES)
        extra = " (profile handlers can't be user plugins)" if hasattr(cls, "pick_profiles") else ""
        raise errors.ConfigError(f"{where}: class {qualname} has no plugin method{extra}; define one of: {wanted}")
    if len(roles) > 1:
        both = " and ".join(f"{r.method}()" for r in roles)
        raise errors.ConfigError(f"{where}: class {qualname} defines {both}; a plugin has exactly one role")
    role = roles[0]
    _check_method(cls, role, where)
    init_args, takes_params = _constructor(cls, where)
    params_type = _params_type(cls, takes_params, where)
    category = getattr(cls, "category", DEFAULT_CATEGORY) if role.role == "Scorer" else DEFAULT_CATEGORY
    if not isinstance(category, Category):
        raise errors.ConfigError(
            f"{where}: {qualname}.category is {category!r}; "
            "use picker.plugins.Category (AFFINITY, DISTRIBUTION or BALANCE)"
        )
    return UserPluginClass(type_name, cls, role.role, params_type, init_args, category, origin)


def _check_method(cls: type[Any], role: _Role, where: str) -> None:
    method = getattr(cls, role.method)
    static = inspect.getattr_static(cls, role.method)
    bound = isinstance(static, staticmethod | classmethod)
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return  # a builtin or C callable without a signature: it will be judged by its calls
    args = [None] * (len(role.args) + (0 if bound else 1))
    try:
        signature.bind(*args)
    except TypeError:
        raise errors.ConfigError(
            f"{where}: {cls.__qualname__}.{role.method}{_names(signature)} can't be called as "
            f"{role.method}({', '.join(role.args)}) (a {role.role})"
        ) from None


def _constructor(cls: type[Any], where: str) -> tuple[frozenset[str], bool]:
    """Which of name / params / ctx the constructor takes, and whether it names ``params`` itself."""
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):
        return frozenset(), False
    taken: set[str] = set()
    for p in signature.parameters.values():
        if p.kind is p.VAR_KEYWORD:
            taken.update(CONSTRUCTOR_ARGS)
        elif p.kind is p.VAR_POSITIONAL:
            continue
        elif p.name in CONSTRUCTOR_ARGS and p.kind is not p.POSITIONAL_ONLY:
            taken.add(p.name)
        elif p.default is p.empty:
            raise errors.ConfigError(
                f"{where}: {cls.__qualname__}{_names(signature)} requires {p.name!r}; a plugin's constructor may take "
                f"only the keywords {', '.join(CONSTRUCTOR_ARGS)}"
            )
    return frozenset(taken), "params" in signature.parameters


def _names(signature: inspect.Signature) -> str:
    """``(self, req, endpoints)``: the parameters without annotations, which may be unresolved strings."""
    return str(
        signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
    )


def _params_type(cls: type[Any], takes_params: bool, where: str) -> type[Any]:
    declared: object = getattr(cls, "Params", None)
    if declared is None and takes_params:
        init: Callable[..., object] = cls.__init__
        try:
            declared = typing.get_type_hints(init).get("params")
        except Exception as exc:
            raise errors.ConfigError(
                f"{where}: cannot resolve the annotation of {cls.__qualname__}.__init__'s params "
                f"({type(exc).__name__}: {exc}); define it at module level, or set Params = <class> on the class"
            ) from exc
        if declared is None:
            raise errors.ConfigError(
                f"{where}: {cls.__qualname__}.__init__ takes params without a type; annotate it with a "
                "pydantic model or a dataclass (or set Params = <class> on the class)"
            )
    if declared is None:
        return NoParams
    if not is_params_type(declared):
        raise errors.ConfigError(
            f"{where}: the parameters type of {cls.__qualname__} is {declared!r}; "
            "it must be a pydantic BaseModel or a dataclass"
        )
    return typing.cast(type[Any], declared)
