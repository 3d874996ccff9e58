"""Test gateways: drive a real picker gRPC server the way each gateway does, and read its answers like it would.

``Gateway.request(...)`` sends one HTTP request's ext_proc messages (and, if given, the response phases) on a new
stream and returns an ``Outcome``: the ImmediateResponse status and body, or the destination, the headers picker
set/removed, the body the upstream would receive and the body the client would receive. Each driver also
checks the protocol rules of its mode (one answer per message outside full duplex, answer order, EOS chunks).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

MODE = processing_mode_pb2.ProcessingMode
DESTINATION = "x-gateway-destination-endpoint"
STREAM_TIMEOUT_S = 10.0


@dataclass
class Response:
    """An upstream response to feed through the response phases."""

    headers: Mapping[str, str]
    chunks: Sequence[bytes] = ()
    trailers: bool = False


@dataclass
class Outcome:
    answers: list[pb.ProcessingResponse]
    status: int | None = None  # ImmediateResponse status
    error_body: bytes = b""
    destination: str | None = None
    metadata_destination: str | None = None
    set_headers: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    clear_route_cache: bool = False
    upstream_body: bytes | None = None  # what the model server would receive
    client_body: bytes | None = None  # what the client would receive

    @property
    def routed(self) -> bool:
        return self.status is None and self.destination is not None


def headers_msg(
    headers: Mapping[str, str],
    *,
    eos: bool = False,
    value_strings: bool = False,
    config: pb.ProtocolConfiguration | None = None,
) -> pb.ProcessingRequest:
    values = [
        base_pb2.HeaderValue(key=k, value=v) if value_strings else base_pb2.HeaderValue(key=k, raw_value=v.encode())
        for k, v in headers.items()
    ]
    msg = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=eos)
    )
    if config is not None:
        msg.protocol_config.CopyFrom(config)
    return msg


def subset_metadata(value: object) -> base_pb2.Metadata:
    st = struct_pb2.Struct()
    st.update({"x-gateway-destination-endpoint-subset": value})
    md = base_pb2.Metadata()
    md.filter_metadata["envoy.lb.subset_hint"].CopyFrom(st)
    return md


def served_metadata(key: str) -> base_pb2.Metadata:
    md = base_pb2.Metadata()
    md.filter_metadata["envoy.lb"].update({"x-gateway-destination-endpoint-served": key})
    return md


async def _aiter(items: Iterable[pb.ProcessingRequest]) -> AsyncIterator[pb.ProcessingRequest]:
    for item in items:
        yield item


async def exchange(channel: grpc.aio.Channel, messages: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
    """Send every message (not waiting for answers, as full duplex does), half-close, read to EOF."""
    call = pb_grpc.ExternalProcessorStub(channel).Process(_aiter(messages), timeout=STREAM_TIMEOUT_S)
    answers: list[pb.ProcessingResponse] = []
    try:
        async for answer in call:
            answers.append(answer)
    except grpc.aio.AioRpcError as err:
        if not _sent_after_the_end(err, answers):
            raise
    return answers


def _sent_after_the_end(err: grpc.aio.AioRpcError, answers: Sequence[pb.ProcessingResponse]) -> bool:
    """An ImmediateResponse ends the call at once (as in the reference EPP); a client still sending the rest of the
    request then finds the stream closed. Envoy and Go clients take that as the end; grpc.aio's client instead
    replaces the server's OK with INTERNAL "Internal error from Core" when the failed send wins the race with the
    status. Only that case is forgiven: the failure is a send, and the last answer was an ImmediateResponse."""
    return (
        err.code() == grpc.StatusCode.INTERNAL
        and "SendMessageOperation" in (err.debug_error_string() or "")
        and bool(answers)
        and answers[-1].HasField("immediate_response")
    )


def _mutation_into(outcome: Outcome, common: pb.CommonResponse) -> None:
    for option in common.header_mutation.set_headers:
        value = option.header.raw_value.decode() if option.header.raw_value else option.header.value
        outcome.set_headers[option.header.key] = value
    outcome.removed.extend(common.header_mutation.remove_headers)
    outcome.clear_route_cache = outcome.clear_route_cache or common.clear_route_cache
    if DESTINATION in outcome.set_headers:
        outcome.destination = outcome.set_headers[DESTINATION]


def _metadata_into(outcome: Outcome, answer: pb.ProcessingResponse) -> None:
    if "envoy.lb" in answer.dynamic_metadata.fields:
        lb = answer.dynamic_metadata.fields["envoy.lb"].struct_value.fields
        if DESTINATION in lb:
            outcome.metadata_destination = lb[DESTINATION].string_value


class Gateway:
    """Base: Envoy in one of its body modes. Subclasses change the message shapes and what is read back."""

    name = "envoy"
    request_mode = MODE.FULL_DUPLEX_STREAMED
    response_mode = MODE.FULL_DUPLEX_STREAMED
    sends_protocol_config = True
    value_strings = False
    sends_path = True
    sends_metadata = True
    sends_response_phases = True
    reads_body = True  # picker sees the body before deciding (False: STREAMED)
    server_profile = "auto"

    def __init__(self, target: str, credentials: grpc.ChannelCredentials | None = None) -> None:
        self.target = target
        self.credentials = credentials
        self._channel: grpc.aio.Channel | None = None

    @property
    def full_duplex(self) -> bool:
        return self.request_mode == MODE.FULL_DUPLEX_STREAMED

    def channel(self) -> grpc.aio.Channel:
        if self.credentials is not None:
            return grpc.aio.secure_channel(self.target, self.credentials)
        return grpc.aio.insecure_channel(self.target)

    async def _exchange(self, messages: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
        if self._channel is None:  # Envoy multiplexes every stream over one HTTP/2 connection
            self._channel = self.channel()
        return await exchange(self._channel, messages)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def config(self) -> pb.ProtocolConfiguration | None:
        if not self.sends_protocol_config:
            return None
        return pb.ProtocolConfiguration(request_body_mode=self.request_mode, response_body_mode=self.response_mode)

    def request_messages(
        self,
        headers: Mapping[str, str],
        chunks: Sequence[bytes],
        *,
        subset: object = None,
        trailers: bool = False,
        response: Response | None = None,
        served: str | None = None,
    ) -> list[pb.ProcessingRequest]:
        hs = dict(headers)
        if not self.sends_path:
            hs.pop(":path", None)
            hs.pop(":method", None)
        eos_on_headers = not chunks and not trailers
        first = headers_msg(hs, eos=eos_on_headers, value_strings=self.value_strings, config=self.config())
        if subset is not None and self.sends_metadata:
            first.metadata_context.CopyFrom(subset_metadata(subset))
        msgs = [first]
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            msgs.append(pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=last and not trailers)))
        if trailers:
            msgs.append(pb.ProcessingRequest(request_trailers=pb.HttpTrailers()))
        if response is not None and self.sends_response_phases:
            rh = headers_msg({":status": "200", **response.headers}, eos=not response.chunks and not response.trailers)
            rh = pb.ProcessingRequest(response_headers=rh.request_headers)
            if served is not None:
                rh.metadata_context.CopyFrom(served_metadata(served))
            msgs.append(rh)
            for i, chunk in enumerate(response.chunks):
                last = i == len(response.chunks) - 1
                msgs.append(
                    pb.ProcessingRequest(
                        response_body=pb.HttpBody(body=chunk, end_of_stream=last and not response.trailers)
                    )
                )
            if response.trailers:
                msgs.append(pb.ProcessingRequest(response_trailers=pb.HttpTrailers()))
        return msgs

    def shape(self, chunks: Sequence[bytes]) -> list[bytes]:
        """The body messages this gateway sends for a body arriving in ``chunks``."""
        return list(chunks)

    async def request(
        self,
        headers: Mapping[str, str],
        chunks: Sequence[bytes] = (),
        *,
        subset: object = None,
        trailers: bool = False,
        response: Response | None = None,
        served: str | None = None,
    ) -> Outcome:
        chunks = self.shape(chunks)
        if response is not None:
            response = Response(response.headers, self.shape(response.chunks), response.trailers)
        msgs = self.request_messages(
            headers, chunks, subset=subset, trailers=trailers, response=response, served=served
        )
        answers = await self._exchange(msgs)
        return self.interpret(msgs, answers, b"".join(chunks), response)

    def interpret(
        self,
        msgs: Sequence[pb.ProcessingRequest],
        answers: Sequence[pb.ProcessingResponse],
        original_body: bytes,
        response: Response | None,
    ) -> Outcome:
        out = Outcome(answers=list(answers))
        kinds = [a.WhichOneof("response") for a in answers]
        if "immediate_response" in kinds:
            assert kinds[-1] == "immediate_response", f"answers after an ImmediateResponse: {kinds}"
            imm = answers[-1].immediate_response
            out.status = int(imm.status.code)
            out.error_body = imm.body
            return out
        if self.full_duplex:
            self._check_full_duplex_order(kinds)
        else:
            sent = [m.WhichOneof("request") for m in msgs]
            assert kinds == sent, f"one answer per message, in order: sent {sent}, got {kinds}"
        upstream: list[bytes] = []
        client: list[bytes] = []
        response_chunks = list(response.chunks) if response is not None else []
        for answer in answers:
            kind = answer.WhichOneof("response")
            _metadata_into(out, answer)
            if kind in ("request_headers", "request_body"):
                common = getattr(answer, kind).response
                _mutation_into(out, common)
                if kind == "request_body":
                    bm = common.body_mutation
                    if self.full_duplex:
                        upstream.append(bm.streamed_response.body)
                    elif bm.HasField("body"):
                        self._check_content_length(common)
                        upstream.append(bm.body)
            elif kind == "response_body":
                common = answer.response_body.response
                bm = common.body_mutation
                if self.response_mode == MODE.FULL_DUPLEX_STREAMED:
                    client.append(bm.streamed_response.body)
                elif bm.HasField("body"):
                    self._check_content_length(common)
                    client.append(bm.body)
                else:
                    client.append(response_chunks[len(client)] if len(client) < len(response_chunks) else b"")
        if self.full_duplex:
            out.upstream_body = b"".join(upstream) if self.reads_body else original_body
        else:
            out.upstream_body = upstream[0] if upstream else original_body
        if response is not None and self.sends_response_phases:
            out.client_body = b"".join(client)
        return out

    def _check_content_length(self, common: pb.CommonResponse) -> None:
        """Envoy in BUFFERED mode answers a replaced body whose Content-Length differs with a local 500."""
        if self.request_mode != MODE.BUFFERED:
            return
        lengths = [o.header.raw_value for o in common.header_mutation.set_headers if o.header.key == "content-length"]
        assert lengths == [str(len(common.body_mutation.body)).encode()], "replaced body without its Content-Length"

    def _check_full_duplex_order(self, kinds: Sequence[str | None]) -> None:
        order = [
            "request_headers",
            "request_body",
            "request_trailers",
            "response_headers",
            "response_body",
            "response_trailers",
        ]
        ranks = [order.index(k) for k in kinds if k is not None]
        assert ranks == sorted(ranks), f"answers out of order: {kinds}"
        assert kinds.count("request_headers") <= 1
        assert kinds.count("response_headers") <= 1


class EnvoyFullDuplex(Gateway):
    name = "envoy-full-duplex"


class EnvoyBuffered(Gateway):
    name = "envoy-buffered"
    request_mode = MODE.BUFFERED
    response_mode = MODE.BUFFERED

    def shape(self, chunks: Sequence[bytes]) -> list[bytes]:
        return [b"".join(chunks)] if chunks else []  # Envoy buffers the body and sends it in one message


class EnvoyStreamed(Gateway):
    name = "envoy-streamed"
    request_mode = MODE.STREAMED
    response_mode = MODE.STREAMED
    reads_body = False


class AgentGateway(Gateway):
    """Full duplex both ways; no protocol_config assumed; picker started with --gateway-profile agentgateway."""

    name = "agentgateway"
    sends_protocol_config = False
    server_profile = "agentgateway"


class NginxShim(Gateway):
    """NGINX Gateway Fabric's Go shim (``cmd/gateway/endpoint_picker.go``): new channel per request; the request's
    headers lower-cased in ``value`` strings, in Go's map order (any: here reversed), no pseudo-headers, no
    ``host``, plus ``x-epp-host``/``x-epp-port``; one body message with EOS, none for an empty body; no metadata,
    no response phases; reads only the request-headers answer's destination ``raw_value``."""

    name = "nginx"
    sends_protocol_config = False
    value_strings = True
    sends_path = False
    sends_metadata = False
    sends_response_phases = False

    async def _exchange(self, messages: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
        async with self.channel() as channel:
            return await exchange(channel, messages)

    def shape(self, chunks: Sequence[bytes]) -> list[bytes]:
        return [b"".join(chunks)] if chunks else []  # the shim reads the whole body, then sends it once

    def request_messages(
        self, headers: Mapping[str, str], chunks: Sequence[bytes], **kw: object
    ) -> list[pb.ProcessingRequest]:
        shim = {k.lower(): v for k, v in reversed(headers.items()) if not k.startswith(":") and k.lower() != "host"}
        shim |= {"x-epp-host": "picker.default", "x-epp-port": "9002"}
        return super().request_messages(shim, chunks, **kw)  # type: ignore[arg-type]

    def interpret(
        self,
        msgs: Sequence[pb.ProcessingRequest],
        answers: Sequence[pb.ProcessingResponse],
        original_body: bytes,
        response: Response | None,
    ) -> Outcome:
        out = Outcome(answers=list(answers))
        for answer in answers:
            kind = answer.WhichOneof("response")
            if kind == "immediate_response":
                out.status = int(answer.immediate_response.status.code)
                out.error_body = answer.immediate_response.body
                return out
            if kind == "request_headers":  # the only thing the shim reads
                for option in answer.request_headers.response.header_mutation.set_headers:
                    if option.header.key == DESTINATION:
                        out.destination = option.header.raw_value.decode()
        out.upstream_body = original_body  # nginx proxies the client's body itself
        return out


GATEWAYS: tuple[type[Gateway], ...] = (EnvoyFullDuplex, EnvoyBuffered, EnvoyStreamed, NginxShim, AgentGateway)


@contextlib.asynccontextmanager
async def gateway(
    cls: type[Gateway], target: str, credentials: grpc.ChannelCredentials | None = None
) -> AsyncIterator[Gateway]:
    gw = cls(target, credentials)
    try:
        yield gw
    finally:
        await gw.close()
