"""The gRPC ``envoy.service.ext_proc.v3.ExternalProcessor`` servicer: ``async for`` message → yield responses.

All protocol logic lives in ``stream.Stream``; this adapter only moves messages, ends the call when the stream
is done, and turns an unexpected exception (a bug) into a logged traceback and gRPC ``INTERNAL``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from picker.extproc.stream import Stream, StreamEnv

__all__ = ["ExtProcServicer", "add_to_server"]

log = logging.getLogger(__name__)


class ExtProcServicer(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def __init__(self, env: StreamEnv) -> None:
        self.env = env
        self.active = 0  # streams being served (for shutdown logs and tests)

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = Stream(self.env)
        self.active += 1
        try:
            async for msg in request_iterator:
                try:
                    out = await stream.on_message(msg)
                except Exception:
                    log.exception("ext_proc stream failed", extra={"phase": stream.phase.name})
                    stream.close()
                    await context.abort(grpc.StatusCode.INTERNAL, "picker internal error")
                for response in out:
                    yield response
                if stream.done:
                    return
        finally:
            self.active -= 1
            stream.close()


def add_to_server(servicer: ExtProcServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
