"""A do-nothing ext_proc server: the floor the overhead benchmark compares picker against.

It does the least a correct FULL_DUPLEX_STREAMED endpoint picker must: waits for the end of the body, answers
the headers with a fixed destination, and streams the body back. Run as ``python -m picker.bench.nullproc PORT
[PROCS] [--native]``: PROCS processes on the one port (SO_REUSEPORT; the kernel spreads the connections), as
``picker serve --workers`` does, so the benchmark can tell what a second process costs gRPC itself.

``--native`` serves on picker's native front (picker.extproc._front) instead of grpc.aio, with the same answers:
the floor for picker on that front, so the benchmark can tell picker's own Python from the front's cost.
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
            for answer in _answers(req.WhichOneof("request"), req, chunks):
                yield answer


def _headers_response() -> pb.ProcessingResponse:
    header = base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key="x-gateway-destination-endpoint", raw_value=_DESTINATION.encode())
    )
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(
            response=pb.CommonResponse(clear_route_cache=True, header_mutation=pb.HeaderMutation(set_headers=[header]))
        )
    )


def _answers(kind: str | None, req: pb.ProcessingRequest, chunks: list[bytes]) -> list[pb.ProcessingResponse]:
    """The answers to one message: none until the body ends, then the routing headers and the body back."""
    if kind == "request_headers" and req.request_headers.end_of_stream:
        return [_headers_response()]
    if kind != "request_body":
        return []
    chunks.append(req.request_body.body)
    if not req.request_body.end_of_stream:
        return []
    body = [
        pb.ProcessingResponse(
            request_body=pb.BodyResponse(
                response=pb.CommonResponse(
                    body_mutation=pb.BodyMutation(
                        streamed_response=pb.StreamedBodyResponse(body=chunk, end_of_stream=i == len(chunks) - 1)
                    )
                )
            )
        )
        for i, chunk in enumerate(chunks)
    ]
    return [_headers_response(), *body]


async def serve_native(port: int, reuse_port: bool) -> None:
    from picker.extproc import _front  # type: ignore[attr-defined]

    front = _front.Front("127.0.0.1", port, reuse_port=reuse_port, max_message=64 * 1024 * 1024, health=False)
    streams: dict[int, list[bytes]] = {}

    def on_ready() -> None:
        for stream_id, kind, payload in front.drain():
            if kind == _front.MESSAGE:
                req = pb.ProcessingRequest.FromString(payload)
                out = _answers(req.WhichOneof("request"), req, streams.setdefault(stream_id, []))
                if out:
                    front.send(stream_id, [r.SerializeToString() for r in out])
            else:  # half-closed (end the call) or gone
                streams.pop(stream_id, None)
                if kind == _front.END:
                    front.send(stream_id, [], True)

    asyncio.get_running_loop().add_reader(front.fileno(), on_ready)
    await asyncio.Event().wait()


async def serve(port: int) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    pb_grpc.add_ExternalProcessorServicer_to_server(NullProcessor(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def _serve_forever(port: int, native: bool = False, reuse_port: bool = False) -> None:
    asyncio.run(serve_native(port, reuse_port) if native else serve(port))


def main(argv: list[str]) -> None:
    native = "--native" in argv
    argv = [a for a in argv if a != "--native"]
    port = int(argv[0])
    procs = int(argv[1]) if len(argv) > 1 else 1
    spawn = multiprocessing.get_context("spawn")
    reuse = procs > 1
    others = [spawn.Process(target=_serve_forever, args=(port, native, reuse), daemon=True) for _ in range(procs - 1)]
    for p in others:
        p.start()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that the others are stopped below
    try:
        _serve_forever(port, native, reuse)
    finally:
        for p in others:
            p.terminate()
        for p in others:
            p.join(5)


if __name__ == "__main__":
    main(sys.argv[1:])
