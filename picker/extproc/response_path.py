"""The response phases of one routed request: answers per body mode, usage, the client's model name restored.

* Streaming (``text/event-stream``, or a STREAMED response mode): each chunk is answered at once; SSE usage is
  read line by line (lines split across chunks included) and a rewritten model name is put back line by line.
* FULL_DUPLEX_STREAMED, not streaming: the body is buffered to EOS (bounded by ``max_response_buffer_bytes``;
  past it, what is held is sent and the rest passes straight through without usage), then sent back as
  ``streamed_response`` chunks with the model name restored and usage read.
* BUFFERED: one message, answered with a replaced body only if the model name had to be restored.

``ResponsePath`` holds no stream-order logic and calls no director: ``Stream`` does both and asks it for the
``status``, ``final_usage()`` and ``response_bytes`` at completion.
"""

from __future__ import annotations

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from picker.extproc import responses
from picker.extproc.gateways import BodyMode
from picker.request import headers as hdr
from picker.request import rewrite
from picker.request.model import InferenceRequest
from picker.request.usage import SSEUsageScanner, Usage, json_usage

__all__ = ["ResponsePath", "rewritten"]


def rewritten(req: InferenceRequest) -> bool:
    """The body sent upstream names another model than the client's (so responses get the name back)."""
    return bool(req.model) and req.target_model != req.model


class ResponsePath:
    def __init__(self, req: InferenceRequest, mode: BodyMode, max_buffer_bytes: int) -> None:
        self.req = req
        self.mode = mode
        self.max_buffer_bytes = max_buffer_bytes
        self.status: int | None = None
        self.response_bytes = 0
        self.streaming = False
        self._usage: Usage | None = None
        self._passthrough = False  # past the buffer cap: chunks go straight back, no usage
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._sse: SSEUsageScanner | None = None
        self._restorer: rewrite.SSEModelRestorer | None = None

    @property
    def sse_events(self) -> int | None:
        """SSE data events seen so far (``[DONE]`` excluded); None when the response is not an event stream."""
        return self._sse.events if self._sse is not None else None

    def final_usage(self) -> Usage | None:
        """The response's usage, once it has ended (flushes a last SSE line without a newline)."""
        if self._sse is not None:
            self._sse.close()
            return self._sse.usage
        return self._usage

    def headers(self, h: pb.HttpHeaders | None) -> None:
        """Response headers (None: the proxy sent none to picker, the body came first)."""
        content_type = ""
        if h is not None:
            for hv in h.headers.headers:
                key = hv.key
                if key == ":status":
                    status = (hv.raw_value or hv.value.encode()).strip()
                    self.status = int(status) if status.isdigit() else None
                elif key.lower() == hdr.CONTENT_TYPE:
                    content_type = (hv.raw_value.decode("latin-1") if hv.raw_value else hv.value).lower()
        self.streaming = "text/event-stream" in content_type
        if self.streaming:
            self._sse = SSEUsageScanner()
            if rewritten(self.req):
                self._restorer = rewrite.SSEModelRestorer(self.req.target_model, self.req.model)

    def body(self, chunk: bytes, eos: bool) -> list[pb.ProcessingResponse]:
        self.response_bytes += len(chunk)
        if self.streaming or self.mode is BodyMode.STREAMED or self._passthrough:
            return self._stream_chunk(chunk, eos)
        if self.mode is BodyMode.FULL_DUPLEX:
            return self._buffer_chunk(chunk, eos)
        # BUFFERED (one message), or a mode that should not send bodies at all.
        if eos:
            self._usage = json_usage(chunk)
        restored = self._restore(chunk)
        if restored is chunk:
            return [responses.EMPTY_RESPONSE_BODY]
        return [responses.body_replaced(restored, response=True, content_length=True)]

    def trailers(self) -> list[pb.ProcessingResponse]:
        """Response trailers end the body: send anything still held, then the trailers answer."""
        out: list[pb.ProcessingResponse] = []
        pending = self._take() if self._chunks else b""
        if pending:
            self._usage = json_usage(pending)
        if self.mode is BodyMode.FULL_DUPLEX:
            # Held chunks were not sent yet (outside full duplex they were only kept to read usage).
            pending = self._restore(pending) if pending else b""
            if self._restorer is not None:
                pending += self._restorer.flush()
            if pending:
                out.extend(responses.streamed_body(pending, end_of_stream=False, response=True))
        out.append(responses.EMPTY_RESPONSE_TRAILERS)
        return out

    def _stream_chunk(self, chunk: bytes, eos: bool) -> list[pb.ProcessingResponse]:
        if self._sse is not None:
            self._sse.feed(chunk)
        elif not self._passthrough:
            self._keep_for_usage(chunk, eos)
        if self._restorer is not None:
            data = self._restorer.feed(chunk)
            if eos:
                data += self._restorer.flush()
        else:
            data = self._restore(chunk)  # a whole JSON value rarely fits one chunk; unparseable passes as is
        if self.mode is BodyMode.FULL_DUPLEX:
            if not data and not eos:
                return []
            return responses.streamed_body(data, end_of_stream=eos, response=True)
        if data is chunk:
            return [responses.EMPTY_RESPONSE_BODY]
        return [responses.body_replaced(data, response=True)]

    def _keep_for_usage(self, chunk: bytes, eos: bool) -> None:
        """A chunk-by-chunk JSON response: keep references (bounded) to read its usage at the end."""
        if chunk:
            self._chunks.append(chunk)
            self._buffered += len(chunk)
            if self._buffered > self.max_buffer_bytes:
                self._take()
                self._passthrough = True  # too big: no usage for this one
                return
        if eos:
            self._usage = json_usage(self._take())

    def _buffer_chunk(self, chunk: bytes, eos: bool) -> list[pb.ProcessingResponse]:
        if chunk:
            self._chunks.append(chunk)
            self._buffered += len(chunk)
        if self._buffered > self.max_buffer_bytes:
            # Too big to hold for usage: send what we have and pass the rest straight through.
            self._passthrough = True
            return responses.streamed_body(self._take(), end_of_stream=eos, response=True)
        if not eos:
            return []
        data = self._take()
        self._usage = json_usage(data)
        return responses.streamed_body(self._restore(data), end_of_stream=True, response=True)

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._chunks = []
        self._buffered = 0
        return data

    def _restore(self, data: bytes) -> bytes:
        if not rewritten(self.req):
            return data
        return rewrite.restore_model(data, self.req.target_model, self.req.model)
