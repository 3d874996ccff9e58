"""A do-nothing ext_proc server: the floor the overhead benchmark compares picker against.

It does the least a correct FULL_DUPLEX_STREAMED endpoint picker must: waits for the end of the body, answers
the headers with a fixed destination, and streams the body back. Run as ``python -m picker.bench.nullproc PORT
[PROCS]``: PROCS processes on the one port (gRPC sets SO_REUSEPORT; the kernel spreads the connections), as
``picker serve --workers`` does, so the benchmark can tell what a second process costs gRPC itself.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import sys
from collections.abc import AsyncIterator

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

__all__ = ["NullProcessor", "serve"]

_DESTINATION = "10.0.0.1:8000"


class NullProcessor(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        chunks: list[bytes] = []
        async for req in request_iterator:
            kind = req.WhichOneof("request")
            if kind == "request_headers" and req.request_headers.end_of_stream:
                yield _headers_response()
            elif kind == "request_body":
                chunks.append(req.request_body.body)
                if req.request_body.end_of_stream:
                    yield _headers_response()
                    for i, chunk in enumerate(chunks):
                        yield pb.ProcessingResponse(
                            request_body=pb.BodyResponse(
                                response=pb.CommonResponse(
                                    body_mutation=pb.BodyMutation(
                                        streamed_response=pb.StreamedBodyResponse(
                                            body=chunk, end_of_stream=i == len(chunks) - 1
                                        )
                                    )
                                )
                            )
                        )


def _headers_response() -> pb.ProcessingResponse:
    header = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key="x-gateway-destination-endpoint", raw_value=_DESTINATION.encode())
    )
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=[header]))
        )
    )


async def serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    pb_grpc.add_ExternalProcessorServicer_to_server(NullProcessor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def _serve_forever(port: int) -> None:
    asyncio.run(serve(port))


def main(argv: list[str]) -> None:
    port = int(argv[0])
    procs = int(argv[1]) if len(argv) > 1 else 1
    spawn = multiprocessing.get_context("spawn")
    others = [spawn.Process(target=_serve_forever, args=(port,), daemon=True) for _ in range(procs - 1)]
    for p in others:
        p.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the others are stopped below
    try:
        _serve_forever(port)
    finally:
        for p in others:
            p.terminate()
        for p in others:
            p.join(5)


if __name__ == "__main__":
    main(sys.argv[1:])
