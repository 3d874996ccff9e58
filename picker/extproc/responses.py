"""ProcessingResponse builders (upb messages from ``xds-protos``), including ``PickerError`` → ImmediateResponse.

Responses that never vary (an empty HeadersResponse, an empty TrailersResponse, ...) are built once and reused:
gRPC only reads a message to serialise it, and nothing mutates them after construction.
"""

from __future__ import annotations

from collections.abc import Sequence

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2

from picker import errors
from picker.request import headers as hdr

__all__ = [
    "BODY_CHUNK_BYTES",
    "EMPTY_REQUEST_BODY",
    "EMPTY_REQUEST_HEADERS",
    "EMPTY_REQUEST_TRAILERS",
    "EMPTY_RESPONSE_BODY",
    "EMPTY_RESPONSE_HEADERS",
    "EMPTY_RESPONSE_TRAILERS",
    "RETRY_AFTER",
    "body_replaced",
    "immediate",
    "lb_metadata",
    "request_body_routed",
    "request_headers_routed",
    "streamed_body",
]

# The reference's BodyByteLimit: "some envoy implementations set a max limit of 64Kb per streamed chunk".
BODY_CHUNK_BYTES = 62_000

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD

EMPTY_REQUEST_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
EMPTY_REQUEST_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse())
EMPTY_REQUEST_TRAILERS = pb.ProcessingResponse(request_trailers=pb.TrailersResponse())
EMPTY_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse())
EMPTY_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse())
EMPTY_RESPONSE_TRAILERS = pb.ProcessingResponse(response_trailers=pb.TrailersResponse())


Headers = Sequence[tuple[str, str]]


def _mutate(m: pb.HeaderMutation, set_headers: Headers, remove_headers: Sequence[str]) -> None:
    """Fill a header mutation in place: every set header overwrites (a client-sent value never survives)."""
    for key, value in set_headers:
        option = m.set_headers.add()
        option.header.key = key
        option.header.raw_value = value.encode()
        option.append_action = _OVERWRITE
    if remove_headers:
        m.remove_headers.extend(remove_headers)


def lb_metadata(response: pb.ProcessingResponse, destination: str) -> pb.ProcessingResponse:
    """Set ``{"envoy.lb": {"x-gateway-destination-endpoint": destination}}``: the same value as the header."""
    response.dynamic_metadata.fields[hdr.LB_NAMESPACE].struct_value.fields[hdr.DESTINATION].string_value = destination
    return response


# Messages are built in place (``msg.a.b.c = v``): upb's keyword constructors copy every submessage, which
# measured 2-5x slower for these shapes.


def request_headers_routed(
    set_headers: Headers, remove_headers: Sequence[str], destination: str
) -> pb.ProcessingResponse:
    """The routing answer on the request-headers phase (FULL_DUPLEX_STREAMED, STREAMED, header-only)."""
    response = pb.ProcessingResponse()
    common = response.request_headers.response
    common.clear_route_cache = True
    _mutate(common.header_mutation, set_headers, remove_headers)
    return lb_metadata(response, destination)


def request_body_routed(
    set_headers: Headers, remove_headers: Sequence[str], destination: str, body: bytes | None
) -> pb.ProcessingResponse:
    """The routing answer on the request-body phase (BUFFERED); ``body`` replaces the body when not None."""
    response = pb.ProcessingResponse()
    common = response.request_body.response
    common.clear_route_cache = True
    _mutate(common.header_mutation, set_headers, remove_headers)
    if body is not None:
        common.body_mutation.body = body
    return lb_metadata(response, destination)


def response_headers_set(set_headers: Headers) -> pb.ProcessingResponse:
    """The answer to the response-headers phase when plugins add headers to the client's response."""
    response = pb.ProcessingResponse()
    _mutate(response.response_headers.response.header_mutation, set_headers, ())
    return response


def body_replaced(body: bytes, *, response: bool, content_length: bool = False) -> pb.ProcessingResponse:
    """A BodyResponse replacing the whole (buffered) or this chunk's (streamed) body.

    ``content_length``: also set the matching Content-Length (BUFFERED: Envoy answers a replaced body whose length
    differs from the message's Content-Length with a local 500).
    """
    answer = pb.ProcessingResponse()
    phase = answer.response_body if response else answer.request_body
    phase.response.body_mutation.body = body
    if content_length:
        _mutate(phase.response.header_mutation, [(hdr.CONTENT_LENGTH, str(len(body)))], ())
    return answer


def streamed_body(body: bytes, *, end_of_stream: bool, response: bool) -> list[pb.ProcessingResponse]:
    """FULL_DUPLEX_STREAMED body: chunks of at most 62 000 bytes, EOS on the last; empty ⇒ one empty chunk."""
    n = len(body)
    if n <= BODY_CHUNK_BYTES:
        pieces = [(body, end_of_stream)]
    else:
        view = memoryview(body)
        pieces = [
            (bytes(view[i : i + BODY_CHUNK_BYTES]), end_of_stream and i + BODY_CHUNK_BYTES >= n)
            for i in range(0, n, BODY_CHUNK_BYTES)
        ]
    out: list[pb.ProcessingResponse] = []
    for piece, eos in pieces:
        answer = pb.ProcessingResponse()
        phase = answer.response_body if response else answer.request_body
        streamed = phase.response.body_mutation.streamed_response
        streamed.body = piece
        streamed.end_of_stream = eos
        out.append(answer)
    return out


RETRY_AFTER = "retry-after"


def immediate(err: errors.PickerError, *, status: int | None = None, retry_after_s: int = 0) -> pb.ProcessingResponse:
    """The one place a ``PickerError`` becomes a reply: its status and ``inference error: <Code> - <msg>``.

    ``retry_after_s`` > 0 adds ``Retry-After`` to a 429 or 503 (``--retry-after``), telling clients when to come back.
    """
    code = status or err.status
    response = pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=code),
            body=err.wire_text.encode(),
            details=f"picker_{err.code}",
        )
    )
    if retry_after_s > 0 and code in (429, 503):
        _mutate(response.immediate_response.headers, [(RETRY_AFTER, str(retry_after_s))], ())
    return response
