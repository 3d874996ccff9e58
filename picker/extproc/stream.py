"""The per-stream state machine of one HTTP request: ProcessingRequest in, ProcessingResponses out. No gRPC.

Request path by body mode (protocol.md §2, gateways.py):

* FULL_DUPLEX_STREAMED: the headers answer is held until the body's EOS (or trailers); then the routing headers
  answer, then the body (possibly with the model rewritten) as ``streamed_response`` chunks ≤ 62 000 bytes, EOS
  on the last; an empty body is one empty EOS chunk. NGINX Gateway Fabric's shim gets only the headers answer.
* BUFFERED: an empty headers answer at once; routing rides on the body answer (header mutations on a body
  answer take effect only in this mode); a changed body goes in ``body_mutation.body``.
* STREAMED / NONE: routing is decided from the headers; each body chunk is passed through.

A request with EOS on its headers is routed at once. Routing answers set ``x-gateway-destination-endpoint``
(overwriting any client-sent value), ``Content-Length`` where the body is sent back, ``x-request-id`` when
picker generated it, the headers plugins set (``x-prefiller-host-port`` for a disaggregated request),
``clear_route_cache`` and the ``envoy.lb`` metadata; control headers, and llm-d's sidecar headers picker did not
set, are removed.

Response path: the headers answer is sent at once; the body is answered chunk by chunk when streaming (SSE or a
STREAMED mode) and buffered to EOS (bounded) otherwise, with the client's model name restored if it was
rewritten and usage read; completion (EOS or trailers) releases the in-flight lease. A stream that ends first
releases it too, unless no response phase was ever going to come (the shim; response body mode NONE): then the
director holds it until its timeout. When the proxy declared a response body mode, the director also awaits the
request's first answer (hung-server detection, ``endpoints/hung.py``): the headers of a non-streamed response, or
any response body chunk.

A ``PickerError`` becomes an ImmediateResponse and ends the stream. Out-of-order messages are a 400 before the
request is routed and a clean close after; anything else raised here is a bug for the servicer to report.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from picker import errors
from picker.control.director import Director, Routed
from picker.extproc import gateways, responses
from picker.extproc.gateways import BodyMode
from picker.extproc.response_path import ResponsePath
from picker.request import headers as hdr
from picker.request.model import InferenceRequest
from picker.request.parse import parse_request
from picker.request.subset import parse_subset
from picker.settings import ServerSettings
from picker.telemetry import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = ["EXPLAIN_HEADER", "Phase", "Stream", "StreamEnv"]

log = logging.getLogger(__name__)

EXPLAIN_HEADER = "x-picker-explain"
_REMOVED = (*sorted(hdr.CONTROL), hdr.DESTINATION_SERVED)
# llm-d's sidecar acts on these: only picker sets them; a client-sent one is removed when picker sets none.
_SIDECAR = (hdr.PREFILLER, hdr.ENCODERS, hdr.DATA_PARALLEL)
_NO_BODY_MODE = processing_mode_pb2.ProcessingMode.NONE
_PARTIAL_MODE = processing_mode_pb2.ProcessingMode.BUFFERED_PARTIAL
_UNSET = object()


@dataclass(frozen=True, slots=True)
class StreamEnv:
    """What every stream shares: built once by the servicer."""

    director: Director
    settings: ServerSettings
    parser: str = "openai"


class Phase(enum.IntEnum):
    START = 0  # nothing yet
    REQUEST = 1  # request headers seen; body accumulating
    ROUTED = 2  # destination sent
    RESPONSE = 3  # response phase started
    COMPLETE = 4  # response finished; lease released
    CLOSED = 5  # failed or torn down: nothing more is answered


class Stream:
    """One ext_proc stream. ``await on_message(msg)`` for each message in order, then ``close()`` once."""

    def __init__(self, env: StreamEnv) -> None:
        self.env = env
        self.phase = Phase.START
        self.done = False  # the servicer should end the stream (after sending what on_message returned)
        self._closed = False
        self.profile = gateways.ENVOY
        self.mode = BodyMode.FULL_DUPLEX
        self.response_mode = BodyMode.FULL_DUPLEX
        self.expect_response = False  # the proxy said it will send the response body (protocol_config)
        self._partial = False  # BUFFERED_PARTIAL: a body message without EOS is a truncated prefix
        self.headers: dict[str, str] = {}
        self.req: InferenceRequest | None = None
        self.routed: Routed | None = None
        self.received_at = 0.0
        self._chunks: list[bytes] = []
        self._size = 0
        self._request_ended = False
        self._got_trailers = False
        self._subset: object = _UNSET
        self._served: str | None = None
        self.response: ResponsePath | None = None  # set when the response phase starts
        self.span: Span | None = None  # gateway.request, with tracing on (telemetry/tracing.py)

    # -- dispatch ----------------------------------------------------------------------------------------

    async def on_message(self, msg: pb.ProcessingRequest) -> Sequence[pb.ProcessingResponse]:
        if self.done:
            return ()
        if msg.HasField("metadata_context"):
            self._read_metadata(msg.metadata_context)
        kind = msg.WhichOneof("request")
        if self.span is None:
            return await self._dispatch(kind, msg)
        with tracing.use(self.span):  # current while a message is handled: the director's spans are its children
            return await self._dispatch(kind, msg)

    async def _dispatch(self, kind: str | None, msg: pb.ProcessingRequest) -> Sequence[pb.ProcessingResponse]:
        try:
            if kind == "request_headers":
                return await self._request_headers(msg)
            if kind == "request_body":
                return await self._request_body(msg.request_body)
            if kind == "request_trailers":
                return await self._request_trailers()
            if kind == "response_headers":
                return self._response_headers(msg.response_headers)
            if kind == "response_body":
                return self._response_body(msg.response_body)
            if kind == "response_trailers":
                return self._response_trailers()
            return ()  # metadata only (or a newer message kind): nothing to answer
        except errors.PickerError as err:
            return self._fail(err)

    def close(self) -> None:
        """The stream ended (either side, any reason): account for a request still in flight. Idempotent."""
        if self._closed:
            return
        self._closed = True
        routed = self.routed
        if routed is not None and not routed.finished:
            if self.phase >= Phase.RESPONSE or self.expect_response:
                # The response started, or the proxy would have sent it: the request is over.
                self.env.director.abandon(routed)
            else:
                self.env.director.hold(routed)  # the request may still be running upstream
        self.phase = Phase.CLOSED
        self.done = True
        if self.span is not None:
            self._end_span(self.span)

    def _start_span(self) -> None:
        tracer = self.env.director.tracer
        if tracer is None:
            return
        from opentelemetry.trace import SpanKind

        self.span = tracer.start_span(
            tracing.REQUEST_SPAN,
            context=tracing.extract(self.headers),
            kind=SpanKind.SERVER,
            attributes={"picker.gateway": self.profile.name, "picker.body_mode": self.mode.value},
        )

    def _end_span(self, span: Span) -> None:
        if span.is_recording():
            req = self.routed.req if self.routed is not None else self.req
            if req is not None:
                span.set_attribute("gen_ai.request.model", req.model)
                span.set_attribute("picker.target_model", req.target_model)
                span.set_attribute("picker.request_id", req.request_id)
            if self.routed is not None:
                span.set_attribute("picker.destination", self.routed.destination)
        span.end()

    # -- request path ------------------------------------------------------------------------------------

    async def _request_headers(self, msg: pb.ProcessingRequest) -> Sequence[pb.ProcessingResponse]:
        if self.phase is not Phase.START:
            return self._violation("request headers received twice")
        director = self.env.director
        self.received_at = director.clock()
        value_strings = self._read_headers(msg.request_headers.headers.headers)
        has_config = msg.HasField("protocol_config")
        self.profile = gateways.choose(
            self.env.settings.gateway_profile, has_protocol_config=has_config, value_strings=value_strings
        )
        if has_config:
            config = msg.protocol_config
            self.mode = gateways.body_mode(config.request_body_mode)
            self.response_mode = gateways.body_mode(config.response_body_mode)
            self.expect_response = config.response_body_mode != _NO_BODY_MODE
            self._partial = config.request_body_mode == _PARTIAL_MODE
        self.phase = Phase.REQUEST
        self._start_span()
        if self.span is None:
            return await self._answer_headers(msg)
        with tracing.use(self.span):  # on_message made no span current: it did not exist yet
            return await self._answer_headers(msg)

    async def _answer_headers(self, msg: pb.ProcessingRequest) -> Sequence[pb.ProcessingResponse]:
        if msg.request_headers.end_of_stream:
            self._request_ended = True
            return [await self._route_on_headers()]
        if self.mode is BodyMode.STREAMED or self.mode is BodyMode.NONE:
            return [await self._route_on_headers()]
        if self.mode is BodyMode.BUFFERED:
            return (responses.EMPTY_REQUEST_HEADERS,)
        return ()  # FULL_DUPLEX: hold the answer until the body is in

    async def _request_body(self, body: pb.HttpBody) -> Sequence[pb.ProcessingResponse]:
        if self.phase is Phase.START:
            return self._violation("request body before request headers")
        if self.phase is not Phase.REQUEST:
            if self.phase is Phase.ROUTED and not self._request_ended and self.mode is not BodyMode.FULL_DUPLEX:
                # STREAMED (decided on headers) or the rest of a BUFFERED_PARTIAL body: pass it on.
                self._request_ended = body.end_of_stream
                return (responses.EMPTY_REQUEST_BODY,)
            return self._violation("request body after the request ended")
        chunk = body.body
        if chunk:
            self._size += len(chunk)
            limit = self.env.settings.max_body_bytes
            if self._size > limit:
                raise errors.PayloadTooLarge(f"request body exceeds the limit of {limit} bytes")
            self._chunks.append(chunk)
        if self.mode is BodyMode.BUFFERED:
            # One body message, answered at once. Without EOS it is either the whole body before trailers
            # (BUFFERED) or a truncated prefix that can't be parsed (BUFFERED_PARTIAL).
            if self._partial and not body.end_of_stream:
                return await self._route_partial()
            self._request_ended = True
            return await self._route_on_body(trailers=not body.end_of_stream)
        if body.end_of_stream:
            self._request_ended = True
            return await self._route_on_body(trailers=False)
        return ()

    async def _request_trailers(self) -> Sequence[pb.ProcessingResponse]:
        if self.phase is Phase.START:
            return self._violation("request trailers before request headers")
        if self.phase is Phase.REQUEST:
            self._request_ended = self._got_trailers = True
            if self.mode is BodyMode.BUFFERED:
                # Trailers but no body message: nothing left to carry a header mutation; route for accounting.
                await self._route_on_headers()
                return (responses.EMPTY_REQUEST_TRAILERS,)
            out = list(await self._route_on_body(trailers=True))
            if not self.done:
                out.append(responses.EMPTY_REQUEST_TRAILERS)
            return out
        if self.phase is Phase.ROUTED and not self._got_trailers:
            self._request_ended = self._got_trailers = True
            return (responses.EMPTY_REQUEST_TRAILERS,)
        return self._violation("request trailers after the request ended")

    async def _route_on_headers(self) -> pb.ProcessingResponse:
        """Route without the body (header-only request, or a mode that answers headers first)."""
        self.req = self._parse(b"")
        routed = await self.env.director.route_without_body(self.req, received_at=self.received_at)
        self._routed(routed)
        return responses.request_headers_routed(*self._mutation(routed, None), self._destination(routed))

    async def _route_partial(self) -> Sequence[pb.ProcessingResponse]:
        self._chunks = []
        self.req = self._parse(b"")
        routed = await self.env.director.route_without_body(self.req, received_at=self.received_at)
        self._routed(routed)
        return (responses.request_body_routed(*self._mutation(routed, None), self._destination(routed), None),)

    async def _route_on_body(self, *, trailers: bool) -> Sequence[pb.ProcessingResponse]:
        chunks = self._chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self.req = self._parse(body)
        director = self.env.director
        if body:
            routed = await director.route(self.req, received_at=self.received_at)
        else:
            routed = await director.route_without_body(self.req, received_at=self.received_at)
        self._routed(routed)
        new_body = routed.req.body
        destination = self._destination(routed)
        if self.mode is BodyMode.BUFFERED:
            changed = new_body is not body and new_body != body
            set_headers, remove = self._mutation(routed, len(new_body) if new_body else None)
            return (responses.request_body_routed(set_headers, remove, destination, new_body if changed else None),)
        set_headers, remove = self._mutation(routed, len(new_body) if new_body else None)
        out = [responses.request_headers_routed(set_headers, remove, destination)]
        if self.profile.echo_request_body and (new_body or not trailers):
            out.extend(responses.streamed_body(new_body, end_of_stream=not trailers, response=False))
        return out

    def _routed(self, routed: Routed) -> None:
        self.routed = routed
        self.phase = Phase.ROUTED
        if self.expect_response:  # the proxy will report the response: a hung server shows as no answer
            self.env.director.watch(routed)
        if log.isEnabledFor(logging.DEBUG):
            req = routed.req
            log.debug(
                "routed",
                extra={
                    "request_id": req.request_id,
                    "model": req.model,
                    "target_model": req.target_model,
                    "destination": routed.destination,
                    "profile": self.profile.name,
                    "mode": self.mode.value,
                },
            )

    def _destination(self, routed: Routed) -> str:
        if self.profile.first_endpoint_only:
            return routed.targets[0].key
        return routed.destination

    def _mutation(self, routed: Routed, content_length: int | None) -> tuple[list[tuple[str, str]], list[str]]:
        """Headers to set and to remove on the routed request."""
        set_headers = [(hdr.DESTINATION, self._destination(routed))]
        if content_length:
            set_headers.append((hdr.CONTENT_LENGTH, str(content_length)))
        if hdr.REQUEST_ID not in self.headers:
            set_headers.append((hdr.REQUEST_ID, routed.req.request_id))
        if self.span is not None:  # the model server's spans join the trace as children of this request's
            set_headers.extend(tracing.inject(self.span))
        if self.env.settings.explain_header and routed.result is not None:
            set_headers.append((EXPLAIN_HEADER, orjson.dumps(routed.result.explain()).decode()))
        plugin_headers = routed.headers
        if plugin_headers:
            set_headers.extend(plugin_headers.items())
        remove = [key for key in _REMOVED if key in self.headers]
        remove.extend(key for key in _SIDECAR if key in self.headers and key not in plugin_headers)
        return set_headers, remove

    def _parse(self, body: bytes) -> InferenceRequest:
        subset = None if self._subset is _UNSET else parse_subset(self._subset)
        return parse_request(
            self.headers,
            body,
            subset=subset,
            parser=self.env.parser,
            max_body_bytes=self.env.settings.max_body_bytes,
        )

    def _read_headers(self, values: Sequence[base_pb2.HeaderValue]) -> bool:
        """Store the request headers (keys lower-cased). True if values came as ``value`` strings (the shim).

        Over ``max_header_bytes`` (names + values, as sent) is a 431: gateways cap headers too (Envoy at 60 KiB by
        default), but picker does not rely on a peer for its memory bound."""
        headers = self.headers
        value_strings = False
        limit = self.env.settings.max_header_bytes
        size = 0
        for h in values:
            raw = h.raw_value
            size += len(h.key) + len(raw) + len(h.value)
            if size > limit:
                raise errors.HeadersTooLarge(f"request headers exceed the limit of {limit} bytes")
            if raw:
                value = raw.decode("utf-8", "replace")
            else:
                value = h.value
                value_strings = value_strings or bool(value)
            key = h.key.lower()
            prev = headers.get(key)
            headers[key] = value if prev is None else f"{prev},{value}"
        return value_strings

    def _read_metadata(self, md: base_pb2.Metadata) -> None:
        """Merge dynamic metadata across messages: a later message's key overrides, absence keeps."""
        fm = md.filter_metadata
        if hdr.SUBSET_NAMESPACE in fm:
            fields = fm[hdr.SUBSET_NAMESPACE].fields
            if hdr.SUBSET_KEY in fields:
                self._subset = _plain(fields[hdr.SUBSET_KEY])
        if hdr.LB_NAMESPACE in fm:
            fields = fm[hdr.LB_NAMESPACE].fields
            if hdr.DESTINATION_SERVED in fields:
                served = _plain(fields[hdr.DESTINATION_SERVED])
                if isinstance(served, str) and served:
                    self._served = served

    # -- response path (response_path.py does the work) ------------------------------------------------

    def _response_headers(self, h: pb.HttpHeaders) -> Sequence[pb.ProcessingResponse]:
        if self.phase is not Phase.ROUTED:
            return self._violation("response headers out of order")
        response = self._start_response()
        response.headers(h)
        assert self.routed is not None
        director = self.env.director
        if not response.streaming:  # the whole response is ready: the server answered
            director.answered(self.routed, response.status)
        extra = director.response_headers(self.routed, self._served)
        if h.end_of_stream:
            self._complete()
        if extra:
            return (responses.response_headers_set(tuple(extra.items())),)
        return (responses.EMPTY_RESPONSE_HEADERS,)

    def _start_response(self) -> ResponsePath:
        assert self.routed is not None
        self.phase = Phase.RESPONSE
        self.response = ResponsePath(self.routed.req, self.response_mode, self.env.settings.max_response_buffer_bytes)
        return self.response

    def _response_body(self, b: pb.HttpBody) -> Sequence[pb.ProcessingResponse]:
        if self.phase is Phase.ROUTED:
            self._start_response().headers(None)  # response headers were not sent to picker
        elif self.phase is not Phase.RESPONSE:
            return self._violation("response body out of order")
        assert self.routed is not None
        assert self.response is not None
        chunk = b.body
        if chunk:
            director = self.env.director
            director.answered(self.routed, self.response.status)
            if self.routed.first_byte_at is None:
                director.first_byte(self.routed, token=self.response.streaming)
        out = self.response.body(chunk, b.end_of_stream)
        if b.end_of_stream:
            self._complete()
        return out

    def _response_trailers(self) -> Sequence[pb.ProcessingResponse]:
        if self.phase is Phase.ROUTED:
            self._start_response().headers(None)
        elif self.phase is not Phase.RESPONSE:
            return self._violation("response trailers out of order")
        assert self.response is not None
        out = self.response.trailers()
        self._complete()
        return out

    def _complete(self) -> None:
        assert self.routed is not None
        assert self.response is not None
        usage = self.response.final_usage()
        self.env.director.complete(
            self.routed,
            status=self.response.status,
            response_bytes=self.response.response_bytes,
            prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            cached_tokens=usage.cached_tokens if usage else None,
            served_key=self._served,
            stream_events=self.response.sse_events,
        )
        self.phase = Phase.COMPLETE

    # -- errors ------------------------------------------------------------------------------------------

    def _fail(self, err: errors.PickerError) -> Sequence[pb.ProcessingResponse]:
        self.env.director.record_error(err, self.req)
        if self.span is not None:
            tracing.fail(self.span, err)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("request failed", extra={"status": err.status, "error": err.wire_text})
        self.done = True
        if self.phase < Phase.ROUTED:
            self.phase = Phase.CLOSED
        return (responses.immediate(err, retry_after_s=self.env.settings.retry_after_s),)

    def _violation(self, what: str) -> Sequence[pb.ProcessingResponse]:
        """A message the protocol does not allow here: 400 before routing, a clean close after."""
        if self.phase < Phase.ROUTED:
            return self._fail(errors.BadRequest(f"invalid ext_proc message order: {what}"))
        log.warning("closing ext_proc stream: %s", what)
        self.done = True
        return ()


def _plain(value: Any) -> object:
    """A protobuf ``Value`` as plain Python (str, float, bool, None, list, dict)."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [_plain(v) for v in value.list_value.values]
    if kind == "number_value":
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    if kind == "struct_value":
        return {k: _plain(v) for k, v in value.struct_value.fields.items()}
    return None
