"""Parser plugin types: ``openai-parser`` (default) and ``passthrough-parser``. No parameters.

Referenced by ``parser.pluginRef``; ``SchedulerConfig.parser`` holds the chosen type, which
``picker.request.parse.parse_request(parser=...)`` accepts as is.
"""

from __future__ import annotations

from picker.plugins import PluginContext, PluginParams
from picker.scheduling.spec import ConfiguredPlugin, PluginSpec

__all__ = ["OPENAI", "OPENAI_SPEC", "PASSTHROUGH", "PASSTHROUGH_SPEC", "Params"]

OPENAI = "openai-parser"
PASSTHROUGH = "passthrough-parser"


class Params(PluginParams):
    """No parameters."""


def _openai(name: str, params: Params, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(OPENAI, name, params, "parser")


def _passthrough(name: str, params: Params, ctx: PluginContext) -> ConfiguredPlugin:
    return ConfiguredPlugin(PASSTHROUGH, name, params, "parser")


OPENAI_SPEC = PluginSpec(OPENAI, Params, _openai, kind="parser")
PASSTHROUGH_SPEC = PluginSpec(PASSTHROUGH, Params, _passthrough, kind="parser")
