"""Tracing with OpenTelemetry: one span per request and per stage, W3C trace context in and out.

Spans (names as the reference EPP's where it has them):

* ``gateway.request`` (SERVER) — one ext_proc stream, from the request headers to the stream's end. Its parent is
  the trace context the client sent (``traceparent``/``tracestate``, or what ``OTEL_PROPAGATORS`` names); its own
  context is sent on to the model server in the routed request's headers, so the server's spans join the trace.
* ``gateway.request_orchestration`` — the director: candidates, admission, scheduling, in-flight lease.
* ``picker.admission`` — admission / flow control, with the time the request waited in a queue.
* ``picker.scheduling`` — one scheduling cycle: candidates, the chosen endpoint(s), every plugin's scores.

``start()`` builds the SDK from the standard environment: ``OTEL_SERVICE_NAME`` (default the reference's
``gateway-api-inference-extension/epp``), ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER[_ARG]`` (the SDK's
default ``parentbased_always_on``), ``OTEL_TRACES_EXPORTER`` (``otlp`` default, ``console``, ``none``) and the
OTLP exporter's ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`` (default ``http://localhost:4317``), ``…_HEADERS``,
``…_TIMEOUT``, ``…_INSECURE``, ``…_CERTIFICATE``. Only OTLP over gRPC is built in.

Spans are exported from the SDK's batch thread; ending a span on the event loop only queues it. Without
``--tracing`` no tracer exists and the request path skips every call here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

__all__ = [
    "ADMISSION_SPAN",
    "DEFAULT_SERVICE_NAME",
    "MAX_ATTRIBUTE_CHARS",
    "ORCHESTRATION_SPAN",
    "REQUEST_SPAN",
    "SCHEDULING_SPAN",
    "child",
    "extract",
    "fail",
    "inject",
    "json_attribute",
    "start",
    "stop",
    "use",
]

REQUEST_SPAN = "gateway.request"
ORCHESTRATION_SPAN = "gateway.request_orchestration"
ADMISSION_SPAN = "picker.admission"
SCHEDULING_SPAN = "picker.scheduling"
DEFAULT_SERVICE_NAME = "gateway-api-inference-extension/epp"
MAX_ATTRIBUTE_CHARS = 8192  # a scores attribute of a large pool is cut here: collectors drop huge attributes


def start(environ: Mapping[str, str] | None = None, *, exporter: SpanExporter | None = None) -> TracerProvider:
    """A tracer provider configured from the OTEL_* environment; ``exporter`` replaces the configured one.

    Raises ``ValueError`` for an exporter or protocol picker does not have.
    """
    env = os.environ if environ is None else environ
    service = env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service}))
    if exporter is None:
        exporter = _exporter(env)
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def stop(provider: TracerProvider) -> None:
    """Flush queued spans and stop the exporter (blocking: run it off the event loop)."""
    provider.shutdown()


def _exporter(env: Mapping[str, str]) -> SpanExporter | None:
    kind = (env.get("OTEL_TRACES_EXPORTER") or "otlp").strip().lower()
    if kind == "none":
        return None
    if kind == "console":
        return ConsoleSpanExporter()
    if kind != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={kind!r}: picker exports traces with otlp, console or none")
    protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    if protocol.strip().lower() != "grpc":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r}: picker exports OTLP over grpc only")
    # Imported here: it loads grpc's OTLP stubs, which a process without tracing never needs.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_* itself


def extract(headers: Mapping[str, str]) -> otel_context.Context:
    """The trace context a client sent in its request headers (keys lower-case), per ``OTEL_PROPAGATORS``."""
    return propagate.extract(headers)


def inject(span: trace.Span) -> list[tuple[str, str]]:
    """The headers that carry ``span``'s context to the next hop (``traceparent``, ``tracestate``, ...)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return list(carrier.items())


@contextlib.contextmanager
def child(tracer: trace.Tracer | None, name: str, **attributes: Any) -> Iterator[trace.Span | None]:
    """A span under the current one, current while the block runs; None (and nothing done) without a tracer.

    An exception leaving the block marks the span as an error; ``PickerError``s carry their HTTP status.
    """
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes=attributes or None, record_exception=False) as span:
        try:
            yield span
        except Exception as exc:
            fail(span, exc)
            raise


def fail(span: trace.Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``: status ERROR, ``error.type``, and the HTTP status of a ``PickerError``."""
    status = getattr(exc, "status", None)
    if isinstance(status, int):
        span.set_attribute("http.response.status_code", status)
    span.set_attribute("error.type", type(exc).__name__)
    span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)[:MAX_ATTRIBUTE_CHARS]))


def json_attribute(value: object) -> str:
    """Compact JSON for a structured attribute (scores), cut at ``MAX_ATTRIBUTE_CHARS``."""
    text = orjson.dumps(value).decode()
    return text if len(text) <= MAX_ATTRIBUTE_CHARS else text[: MAX_ATTRIBUTE_CHARS - 1] + "…"


def use(span: trace.Span) -> contextlib.AbstractContextManager[Any]:
    """Make ``span`` current for a block (its children attach to it); it is not ended on exit."""
    return trace.use_span(span, end_on_exit=False)
