"""picker's plugin API: write a scorer, filter or picker as a small Python class, name it in the config.

A scorer::

    from collections.abc import Sequence
    from dataclasses import dataclass

    from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, Scores


    @dataclass(frozen=True)
    class Params:
        header: str = "x-tenant"
        label: str = "tenant"


    class TenantScorer:
        category = Category.AFFINITY

        def __init__(self, params: Params) -> None:
            self.params = params

        def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Scores:
            wanted = req.headers.get(self.params.header)
            return [1.0 if e.labels.get(self.params.label) == wanted else 0.0 for e in endpoints]

named in an EndpointPickerConfig as ``type: my_package.module:TenantScorer``, or by a short name that a
pip-installed distribution registers in the entry-point group ``picker.plugins``. The constructor may take any
of the keyword arguments ``name`` (str), ``params`` (its parameters class, a pydantic model or a dataclass)
and ``ctx`` (a ``PluginContext``). picker isolates such plugins: an exception, an invalid result or a call over
its time budget drops that plugin's contribution for the cycle (counted in ``picker_plugin_errors_total``),
never the request. See docs/plugins.md.

Everything here is also what the built-in plugins use.
"""

from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.plugins.api import (
    ROTATE_TIES,
    Category,
    CycleState,
    Filter,
    LoadView,
    Picker,
    PluginContext,
    ProfileResult,
    ScoredEndpoint,
    Scorer,
    Scores,
    ServerLoad,
)
from picker.plugins.params import NoParams, PluginParams
from picker.plugins.results import (
    EndpointsChanged,
    FirstToken,
    PluginTiming,
    PostResponse,
    PreRequest,
    ProfileRun,
    RequestHeaders,
    ResponseHeaders,
    ResponseInfo,
    SchedulingResult,
)
from picker.request.model import ApiKind, InferenceRequest

ENTRY_POINT_GROUP = "picker.plugins"
"""The entry-point group in which a distribution registers plugin types: ``name = "module:Class"``."""

__all__ = [
    "ENTRY_POINT_GROUP",
    "ROTATE_TIES",
    "ApiKind",
    "Category",
    "CycleState",
    "Endpoint",
    "EndpointMetrics",
    "EndpointsChanged",
    "Filter",
    "FirstToken",
    "InferenceRequest",
    "LoadView",
    "NoParams",
    "Picker",
    "PluginContext",
    "PluginParams",
    "PluginTiming",
    "PostResponse",
    "PreRequest",
    "ProfileResult",
    "ProfileRun",
    "RequestHeaders",
    "ResponseHeaders",
    "ResponseInfo",
    "SchedulingResult",
    "ScoredEndpoint",
    "Scorer",
    "Scores",
    "ServerLoad",
]
