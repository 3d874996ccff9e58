"""The built-in table: one entry per type; every plugin module has the documented shape."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from pydantic import ValidationError

import picker.scheduling.plugins as plugins_pkg
from picker.scheduling import registry
from picker.scheduling.framework import Filter, Picker, ProfileHandler, RequestHeaders, Scorer
from picker.scheduling.plugins.pd_deciders import Decider
from picker.scheduling.spec import ConfiguredPlugin, PluginParams
from tests.scheduling.helpers import ctx

PLUGIN_MODULES = [
    m.name
    for m in pkgutil.iter_modules(plugins_pkg.__path__)
    if m.name not in {"prefix_index", "datalayer", "saturation", "parsers"}
]


def test_every_plugin_module_is_registered() -> None:
    registered = {spec.type for spec in registry.BUILTINS.values()}
    for name in PLUGIN_MODULES:
        module = importlib.import_module(f"picker.scheduling.plugins.{name}")
        assert module.TYPE in registered
        assert registry.BUILTINS[module.TYPE] is module.SPEC
        assert module.SPEC.params is module.Params
        assert module.__doc__
        assert module.TYPE in module.__doc__


@pytest.mark.parametrize("type_name", registry.known_types())
def test_each_spec_builds_its_type(type_name: str) -> None:
    spec = registry.BUILTINS[type_name]
    assert issubclass(spec.params, PluginParams)
    params = spec.params()
    with pytest.raises(ValidationError):  # frozen
        params.__setattr__("anything", 1)
    plugin = spec.create("instance", params, ctx())
    assert plugin.type == type_name
    assert plugin.name == "instance"
    if spec.kind == "scheduling":
        assert isinstance(plugin, Filter | Scorer | Picker | ProfileHandler | Decider | RequestHeaders)
    else:
        assert isinstance(plugin, ConfiguredPlugin)
        assert plugin.kind == spec.kind


def test_accepted_data_layer_types() -> None:
    for t in ("metrics-data-source", "core-metrics-extractor", "endpoint-notification-source"):
        assert registry.lookup(t) is not None
    assert registry.lookup("no-such-plugin") is None
