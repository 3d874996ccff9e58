"""``picker serve`` on SIGTERM, step by step: NOT_SERVING at once, new streams accepted during the grace period and
refused after it, an in-flight stream still completes, then exit 0."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from picker.bench import procs
from tests.extproc.gateway import MODE, exchange, headers_msg

pytestmark = pytest.mark.timeout(60)

BUFFERED = pb.ProtocolConfiguration(request_body_mode=MODE.BUFFERED)
BODY = pb.ProcessingRequest(request_body=pb.HttpBody(body=b'{"model":"m","prompt":"p"}', end_of_stream=True))


def free_port() -> int:
    return procs.free_port()  # outside the ephemeral range: no outgoing connection takes it meanwhile


async def readiness(stub: health_pb2_grpc.HealthStub) -> int:
    reply = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=2)
    return int(reply.status)


async def routed(channel: grpc.aio.Channel) -> bool:
    """One whole BUFFERED request on a new stream; True when picker routed it, False when the stream was refused."""
    try:
        answers = await exchange(channel, [headers_msg({":path": "/v1/completions"}, config=BUFFERED), BODY])
    except grpc.aio.AioRpcError:
        return False
    return (
        answers[-1].request_body.response.header_mutation.set_headers[0].header.key == "x-gateway-destination-endpoint"
    )


async def test_sigterm_sequence() -> None:
    grpc_port, health_port = free_port(), free_port()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "picker.cli", "serve",
        "--endpoints", "127.0.0.1:9", "--host", "127.0.0.1",
        "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--metrics-port", "0",
        "--secure-serving=false", "--grace-period", "2s", "--termination-grace", "20s",
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )  # fmt: skip
    try:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{health_port}") as health_channel,
            grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
        ):
            health = health_pb2_grpc.HealthStub(health_channel)
            async with asyncio.timeout(20):
                while True:
                    try:
                        if await readiness(health) == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.aio.AioRpcError:
                        pass
                    await asyncio.sleep(0.1)

            # An in-flight request: headers answered, body held back by the "client" until we release it.
            release = asyncio.Event()

            async def held() -> AsyncIterator[pb.ProcessingRequest]:
                yield headers_msg({":path": "/v1/completions"}, config=BUFFERED)
                await release.wait()
                yield BODY

            call = pb_grpc.ExternalProcessorStub(channel).Process(held(), timeout=30)
            assert (await call.read()).WhichOneof("response") == "request_headers"

            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(5):
                while await readiness(health) != health_pb2.HealthCheckResponse.NOT_SERVING:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            assert await routed(channel)  # within the grace period new streams are still served

            async with asyncio.timeout(10):  # after it they are refused
                while await routed(channel):  # noqa: ASYNC110 - each probe is a whole request
                    await asyncio.sleep(0.1)
            assert proc.returncode is None  # still draining the held request

            release.set()
            answer = await call.read()
            routed_to = {
                h.header.key: h.header.raw_value for h in answer.request_body.response.header_mutation.set_headers
            }
            assert routed_to["x-gateway-destination-endpoint"] == b"127.0.0.1:9"
            assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
