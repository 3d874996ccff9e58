"""``picker serve`` as a process: its own event loop, the signals, and the graceful stop around ``serving``.

SIGTERM: health turns NOT_SERVING at once, new streams are still accepted for ``grace_period_s`` (so gateways see
the health change first), then refused; in-flight streams get up to ``termination_grace_s`` to finish; exit 0. With
``--ha-enable-leader-election`` only the holder of the pool's Lease reports ready; on SIGTERM the leader releases
the Lease at once (with the health change), so a standby takes over while the old leader is still draining.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable

from picker import errors
from picker.app.root import STATIC_POOL_NAME, serving
from picker.discovery import kubesettings
from picker.settings import Settings

__all__ = ["run_settings", "serve"]

log = logging.getLogger("picker")


def run_settings(settings: Settings, kube: kubesettings.KubeSettings | None) -> int:
    """Serve until SIGTERM in a new event loop (uvloop's when installed). Logging must be configured."""
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            return runner.run(serve(settings, kube=kube))
    except errors.ConfigError as exc:
        log.error("configuration error: %s", exc)
        return 2


def _freeze_startup_heap() -> None:
    """Move what start-up made (modules, configuration, the servers) out of the collector's reach: every full
    collection walked them all, pausing every request in flight (docs/performance.md); they live as long as the
    process, so there is nothing to find."""
    gc.collect()
    gc.freeze()


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop when it is installed (optional; not a dependency), else asyncio's default."""
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


async def serve(settings: Settings, *, kube: kubesettings.KubeSettings | None = None) -> int:
    """Run until SIGTERM/SIGINT, then drain and stop. Returns the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pool_name = kube.pool_name if kube is not None and kube.pool_name else STATIC_POOL_NAME
    async with serving(settings, kube=kube, pool_name=pool_name) as running:
        _freeze_startup_heap()
        log.info(
            "picker serving",
            extra={
                "grpc_port": running.grpc_port,
                "health_port": running.health_port,
                "metrics_port": running.metrics_port,
                "tls": running.certificate is not None,
                "endpoints": len(running.store.current()),
            },
        )
        await stop.wait()
        stop.clear()
        log.info("shutting down: health NOT_SERVING, draining", extra={"grace_s": settings.server.grace_period_s})
        await running.begin_shutdown()
        # Keep accepting streams a moment so gateways notice the health change before connections are refused;
        # a second signal skips the wait.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.server.grace_period_s)
    log.info("picker stopped")
    return 0
