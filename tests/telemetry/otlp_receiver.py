"""An in-process OTLP/gRPC trace receiver: the collector stand-in for the tracing tests.

It implements ``opentelemetry.proto.collector.trace.v1.TraceService/Export`` (the same service an OpenTelemetry
Collector's ``otlp`` receiver serves on 4317) with grpc.aio on 127.0.0.1, and keeps every span it is sent, with
its resource attributes, as plain values the tests can query.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2


def _value(v: common_pb2.AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a root span
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int  # 0 unset, 1 ok, 2 error
    start_ns: int
    end_ns: int


@dataclass
class Receiver:
    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    exports: int = 0
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def named(self, name: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.name == name]

    async def wait_for(self, name: str, count: int = 1, timeout_s: float = 10.0) -> list[ReceivedSpan]:
        async with asyncio.timeout(timeout_s):
            while len(self.named(name)) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.named(name)

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        self.exports += 1
        for resource_spans in request.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            resource=resource,
                            status_code=s.status.code,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                        )
                    )
        self._arrived.set()


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.receiver.take(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[Receiver]:
    """A started receiver on an ephemeral 127.0.0.1 port."""
    rec = Receiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(rec), server)
    rec.port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield rec
    finally:
        await server.stop(0)
