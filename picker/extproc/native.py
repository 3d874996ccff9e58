"""ext_proc on the native front (``picker.extproc._front``, Rust: native/front): gRPC's machinery off the GIL.

With grpc.aio, picker was the do-nothing server plus its request path (docs/performance.md): HTTP/2, gRPC framing
and grpc.aio's per-message objects and callbacks cost about as much as the whole Python path, on the same core and
under the same GIL. The front runs HTTP/2, TLS and framing on its own threads and hands Python whole messages in
batches (one wake-up of the loop per batch), so Python spends its time on the requests.

The protocol stays in ``stream.Stream``; this adapter does what ``servicer.ExtProcServicer`` does for grpc.aio:
one ``Stream`` per call, messages in order, the call ended when the stream is done (OK) or the client half-closes,
``Stream.close()`` when the call ends for any reason, and a bug reported as ``INTERNAL``. A message is handled at
once when ``on_message`` finishes without suspending (the usual case); one that suspends (flow control's queue)
finishes as a task, and that stream's later events wait for it, so each stream keeps its order while the others go
on.

TLS is rustls; certificate files are reloaded as with grpc.aio (``CertificateFiles.fetch_pem`` is asked before
each handshake). What grpc.aio offered and the front does not: gRPC compression (gateways do not compress
ext_proc) and channelz. ``--grpc-frontend grpc`` keeps grpc.aio.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Generator, Sequence
from typing import Any

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from picker.extproc import health
from picker.extproc.stream import Stream, StreamEnv

try:
    from picker.extproc import _front  # type: ignore[attr-defined]
except ImportError:  # built by scripts/install.sh when cargo is there; grpc.aio serves without it
    _front = None

__all__ = ["AVAILABLE", "NativeExtProc"]

log = logging.getLogger(__name__)

AVAILABLE = _front is not None
_MESSAGE, _END, _GONE, _STOPPED = 0, 1, 2, 3
_INVALID_ARGUMENT, _INTERNAL = 3, 13
_ABORT_FLUSH_S = 0.1


class _Call:
    __slots__ = ("backlog", "busy", "stream", "task")

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.busy = False  # a message's handling suspended: later events wait in the backlog
        self.backlog: deque[tuple[int, bytes | None]] = deque()
        self.task: asyncio.Task[None] | None = None  # the suspended handling


class _Resume:
    """Await a coroutine that already ran to its first suspension (``waiting``: what it yielded)."""

    __slots__ = ("coro", "waiting")

    def __init__(self, coro: Coroutine[Any, Any, Sequence[pb.ProcessingResponse]], waiting: Any) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, None, Sequence[pb.ProcessingResponse]]:
        coro, waiting = self.coro, self.waiting
        while True:
            try:
                yield waiting
            except BaseException as exc:  # cancellation: into the coroutine, as a task would
                try:
                    waiting = coro.throw(exc)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                continue
            try:
                waiting = coro.send(None)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


class NativeExtProc:
    """Serves ext_proc (and gRPC health) on one port through the native front."""

    def __init__(
        self,
        env: StreamEnv,
        host: str,
        port: int,
        *,
        reuse_port: bool,
        max_message: int,
        health_servicer: health.HealthServicer | None,
        cert_pem: bytes | None = None,
        key_pem: bytes | None = None,
        client_ca_pem: bytes | None = None,
        reload: Callable[[], tuple[bytes, bytes, bytes | None] | None] | None = None,
    ) -> None:
        if _front is None:
            raise RuntimeError("picker.extproc._front is not built (scripts/install.sh builds it with cargo)")
        self.env = env
        self._front = _front.Front(
            host,
            port,
            reuse_port=reuse_port,
            max_message=max_message,
            health=health_servicer is not None,
            cert_pem=cert_pem,
            key_pem=key_pem,
            client_ca_pem=client_ca_pem,
            reload=reload,
        )
        self.port: int = self._front.port
        self._calls: dict[int, _Call] = {}
        self._health = health_servicer
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped = False
        self._server_done = asyncio.Event()  # after begin_stop: every connection closed

    @property
    def active(self) -> int:
        """Streams being served."""
        return len(self._calls)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._front.fileno(), self._on_ready)
        if self._health is not None:
            self._health.listen(self._publish_health)
            self._publish_health()

    async def stop(self, grace_s: float) -> None:
        """Refuse new connections (GOAWAY), let calls in progress finish for up to ``grace_s``, end the rest."""
        if self._stopped:
            return
        self._front.begin_stop()
        # The front says when every connection has closed (their calls answered and flushed) with an event, so
        # stopping starts no thread (a thread left behind makes a later fork of this process unsafe, as
        # subprocess's preexec_fn does).
        if grace_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server_done.wait(), grace_s)
        self._stopped = True
        for stream_id, call in list(self._calls.items()):
            if call.task is not None:
                call.task.cancel()
            self._forget(stream_id)
        if self._front.abort_all():
            await asyncio.sleep(_ABORT_FLUSH_S)  # the front's thread sends the UNAVAILABLE answers
        self._front.terminate()
        if self._loop is not None:
            self._loop.remove_reader(self._front.fileno())

    def _publish_health(self) -> None:
        assert self._health is not None
        self._front.set_health({service: self._health.status(service) for service in health.SERVICES})

    # -- events --------------------------------------------------------------------------------------------

    def _on_ready(self) -> None:
        calls = self._calls
        for stream_id, kind, payload in self._front.drain():
            if kind == _STOPPED:
                self._server_done.set()
                continue
            call = calls.get(stream_id)
            if call is None:
                if kind != _MESSAGE:
                    if kind == _END:  # a call that sent nothing: nothing to answer
                        self._front.send(stream_id, [], True)
                    continue
                call = calls[stream_id] = _Call(Stream(self.env))
            if call.busy:
                if kind == _GONE and call.task is not None:
                    call.task.cancel()  # as grpc.aio cancels a call's handler: a queued request leaves its queue
                else:
                    call.backlog.append((kind, payload))
            else:
                self._event(stream_id, call, kind, payload)

    def _event(self, stream_id: int, call: _Call, kind: int, payload: bytes | None) -> None:
        if kind == _MESSAGE:
            assert payload is not None
            self._message(stream_id, call, payload)
        elif kind == _END:  # the client half-closed: the call ends, as grpc.aio's does when its iterator does
            self._front.send(stream_id, [], True)
            self._forget(stream_id)
        else:  # cancelled or reset
            self._forget(stream_id)

    def _message(self, stream_id: int, call: _Call, payload: bytes) -> None:
        stream = call.stream
        try:
            msg = pb.ProcessingRequest.FromString(payload)
        except DecodeError:
            self._front.abort(stream_id, _INVALID_ARGUMENT, "malformed ProcessingRequest")
            self._forget(stream_id)
            return
        coro = stream.on_message(msg)
        # A context of its own, as a task would have: a contextvar set before a suspension is reset after it.
        context = contextvars.copy_context()
        try:
            waiting = context.run(coro.send, None)
        except StopIteration as done:
            self._answer(stream_id, call, done.value)
            return
        except Exception:
            self._fail(stream_id, call)
            return
        call.busy = True
        assert self._loop is not None
        call.task = self._loop.create_task(self._resume(stream_id, call, _Resume(coro, waiting)), context=context)

    async def _resume(self, stream_id: int, call: _Call, rest: _Resume) -> None:
        try:
            out = await rest
        except asyncio.CancelledError:  # the call is gone (or picker is stopping)
            self._forget(stream_id)
            return
        except Exception:
            call.busy, call.task = False, None
            self._fail(stream_id, call)
            return
        call.busy, call.task = False, None
        self._answer(stream_id, call, out)
        while call.backlog and not call.busy and stream_id in self._calls:
            kind, payload = call.backlog.popleft()
            self._event(stream_id, call, kind, payload)

    def _answer(self, stream_id: int, call: _Call, out: Sequence[pb.ProcessingResponse]) -> None:
        done = call.stream.done
        if out or done:
            self._front.send(stream_id, [response.SerializeToString() for response in out], done)
        if done:
            self._forget(stream_id)

    def _fail(self, stream_id: int, call: _Call) -> None:
        log.exception("ext_proc stream failed", extra={"phase": call.stream.phase.name})
        self._front.abort(stream_id, _INTERNAL, "picker internal error")
        self._forget(stream_id)

    def _forget(self, stream_id: int) -> None:
        call = self._calls.pop(stream_id, None)
        if call is not None:
            call.stream.close()
