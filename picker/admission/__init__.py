"""Admission: saturation detection, shedding and flow control, between parsing and scheduling.

``build_admitter`` picks the director's ``Admitter`` from the configuration: with ``featureGates: [flowControl]``
a ``FlowController`` (priority bands, fairness, TTLs; it follows the store's snapshots), otherwise a
``ShedAdmitter`` (sheddable requests get 429, or ``--shed-status``, while the pool is saturated).
"""

from picker.admission.flow import FlowController
from picker.admission.flowconfig import BandConfig, FlowConfig, parse_flow_config
from picker.admission.saturation import SaturationDetector, detector_for
from picker.admission.shedding import SHED_MESSAGE, ShedAdmitter, shed_error
from picker.endpoints.store import EndpointStore
from picker.scheduling.config import SchedulerConfig
from picker.scheduling.framework import PluginContext

__all__ = [
    "FLOW_CONTROL",
    "SHED_MESSAGE",
    "BandConfig",
    "FlowConfig",
    "FlowController",
    "SaturationDetector",
    "ShedAdmitter",
    "build_admitter",
    "detector_for",
    "parse_flow_config",
    "shed_error",
]

FLOW_CONTROL = "flowControl"


def build_admitter(
    config: SchedulerConfig,
    ctx: PluginContext,
    *,
    store: EndpointStore,
    shed_status: int = 429,
    pool_name: str = "",
) -> ShedAdmitter | FlowController:
    """The admitter ``config`` asks for. Raises ``errors.ConfigError`` for a bad ``flowControl`` section."""
    detector = detector_for(config, ctx)
    if not config.feature(FLOW_CONTROL):
        return ShedAdmitter(detector, shed_status=shed_status)
    controller = FlowController(
        detector=detector,
        candidates=lambda: store.current().candidates(),
        clock=ctx.clock,
        config=parse_flow_config(config.flow_control, config.plugins, source=config.source),
        pool_name=pool_name,
    )
    store.subscribe(controller.on_snapshot)
    return controller
