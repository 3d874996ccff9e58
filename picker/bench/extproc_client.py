"""A minimal ext_proc client that speaks like Envoy in FULL_DUPLEX_STREAMED mode (benchmarks and the demo).

One gRPC stream per HTTP request: request headers, the body in chunks of at most 64 KiB (EOS on the last), then
half-close; reads responses until the body has come back with end_of_stream (or an ImmediateResponse arrives).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

__all__ = ["Exchange", "ExtProcClient", "build_messages"]

CHUNK_BYTES = 64 * 1024
_FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


@dataclass(frozen=True, slots=True)
class Exchange:
    destination: str  # "" when the answer was an ImmediateResponse
    status: int  # 200, or the ImmediateResponse's HTTP status
    decision_s: float  # last request byte sent → headers response received
    total_s: float  # stream open → body back with end_of_stream


def build_messages(headers: Mapping[str, str], body: bytes) -> list[pb.ProcessingRequest]:
    hdrs = pb.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
        ),
        end_of_stream=not body,
    )
    first = pb.ProcessingRequest(
        request_headers=hdrs,
        protocol_config=pb.ProtocolConfiguration(request_body_mode=_FULL_DUPLEX, response_body_mode=_FULL_DUPLEX),
    )
    messages = [first]
    for start in range(0, len(body), CHUNK_BYTES):
        chunk = body[start : start + CHUNK_BYTES]
        messages.append(
            pb.ProcessingRequest(request_body=pb.HttpBody(body=chunk, end_of_stream=start + CHUNK_BYTES >= len(body)))
        )
    return messages


class ExtProcClient:
    def __init__(self, target: str, *, root_certificate: bytes | None = None, own_connection: bool = False) -> None:
        """``own_connection``: a TCP connection of its own (gRPC otherwise shares one among a process's channels
        to the same target), e.g. to reach several ``--workers`` behind one port."""
        options: list[tuple[str, int | str]] = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        if own_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        if root_certificate is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificate)
            self._channel = grpc.aio.secure_channel(
                target, creds, options=[*options, ("grpc.ssl_target_name_override", "localhost")]
            )
        self._stub = pb_grpc.ExternalProcessorStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def exchange(self, messages: list[pb.ProcessingRequest]) -> Exchange:
        started = time.perf_counter()
        call = self._stub.Process()
        for message in messages:
            await call.write(message)
        sent = time.perf_counter()
        await call.done_writing()
        destination, status, decided = "", 200, 0.0
        while True:
            resp = await call.read()
            if resp is grpc.aio.EOF:
                break
            kind = resp.WhichOneof("response")
            if kind == "immediate_response":
                status = int(resp.immediate_response.status.code)
                decided = time.perf_counter()
                break
            if kind == "request_headers":
                decided = time.perf_counter()
                for opt in resp.request_headers.response.header_mutation.set_headers:
                    if opt.header.key == "x-gateway-destination-endpoint":
                        destination = opt.header.raw_value.decode()
                if len(messages) == 1:
                    break
            elif kind == "request_body":
                streamed = resp.request_body.response.body_mutation.streamed_response
                if streamed.end_of_stream:
                    break
        call.cancel()
        return Exchange(destination, status, decided - sent, time.perf_counter() - started)
