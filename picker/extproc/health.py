"""gRPC health (``grpc.health.v1``) on its own plaintext port, as the reference EPP serves it (port 9003), and on the
ext_proc port (with its TLS), so a gateway can health-check the port it calls.

Services: ``""``, ``inference-extension`` (what the chart probes), ``readiness`` and
``envoy.service.ext_proc.v3.ExternalProcessor`` (what Envoy's gRPC health check names) are SERVING once the
endpoints are synced and until shutdown starts; ``liveness`` is SERVING while the process runs (a slow first sync
or a drain is no reason to be restarted). Any other name is SERVICE_UNKNOWN — from ``Check`` too, as the
reference answers, rather than a NOT_FOUND error. ``Watch`` is implemented (the reference leaves it out).

With leader election (``require_leader()``, active-passive as the reference) the readiness services also need
leadership (``set_leader``): a standby keeps its endpoints warm but is not ready, so the Service sends it nothing.
``liveness`` stays SERVING on every replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

__all__ = ["LIVENESS", "READY_SERVICES", "SERVICES", "HealthServicer", "add_to_server"]

SERVING: int = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING: int = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN: int = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN

LIVENESS = "liveness"
READY_SERVICES = ("", "inference-extension", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")
SERVICES = (*READY_SERVICES, LIVENESS)


class HealthServicer(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self) -> None:
        self._ready = False
        self._draining = False
        self._needs_leader = False
        self._leader = False
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    @property
    def ready(self) -> bool:
        return self._ready and not self._draining and (self._leader or not self._needs_leader)

    def require_leader(self) -> None:
        """Leader election is on: readiness needs ``set_leader(True)`` too. Call before serving."""
        if not self._needs_leader:
            self._needs_leader = True
            self._notify()

    def set_leader(self, leader: bool) -> None:
        """This replica gained (True) or lost (False) leadership. Call on the event loop."""
        if leader != self._leader:
            self._leader = leader
            self._notify()

    def set_ready(self, ready: bool) -> None:
        """Endpoints synced (True) or lost (False). Call on the event loop."""
        if ready != self._ready:
            self._ready = ready
            self._notify()

    def drain(self) -> None:
        """Shutdown began: every readiness service turns NOT_SERVING for good."""
        if not self._draining:
            self._draining = True
            self._notify()

    def status(self, service: str) -> int:
        if service == LIVENESS:
            return SERVING
        if service in READY_SERVICES:
            return SERVING if self.ready else NOT_SERVING
        return SERVICE_UNKNOWN

    def listen(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after every change (the native front keeps its own table of the statuses)."""
        self._listeners.append(listener)

    def _notify(self) -> None:
        old, self._changed = self._changed, asyncio.Event()
        old.set()
        for listener in self._listeners:
            listener()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        return health_pb2.HealthCheckResponse(status=self.status(request.service))

    async def List(
        self, request: health_pb2.HealthListRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthListResponse:
        response = health_pb2.HealthListResponse()
        for service in SERVICES:
            response.statuses[service].status = self.status(service)
        return response

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last: int | None = None
        while True:
            changed = self._changed
            status = self.status(request.service)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await changed.wait()


def add_to_server(servicer: HealthServicer, server: grpc.aio.Server) -> None:
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
