"""Coverage-guided fuzzer (atheris = libFuzzer for Python) over ext_proc message sequences and request bodies.

Each input is decoded (``atheris.FuzzedDataProvider``) into one stream: a protocol_config (body modes of every
kind), headers from a table of meaningful names (``:path`` of each API, control headers, a spoofed destination,
CR/LF values, oversized values) and raw values, body chunks (JSON built from fuzzed parts, raw bytes, nested
brackets, invalid UTF-8, duplicate keys), trailers, response phases, subset hints and served-endpoint metadata, in
any order. The sequence runs through ``extproc.stream.Stream`` with the real director, scheduler (the reference
configuration), parser and response path; only gRPC is left out, so libFuzzer gets thousands of cases a second.
``tests/extproc/test_fuzz.py`` drives the same surface over real gRPC (hypothesis) and
``tests/extproc/test_bad_input.py`` pins the named cases.

Invariants checked on every input (a violation raises, which libFuzzer reports as a crash with the input saved):

* no exception other than ``PickerError`` leaves the stream (those become answers); no message takes > 5 s;
* at most one ImmediateResponse, and nothing after it; its status is a 4xx (413/431 for oversized input), or 503
  for a subset hint that matches nothing; its body is ``inference error: <Code> - <message>`` with a message;
* a routed request names an endpoint of the pool, never a client-supplied one;
* after the stream closes, picker's in-flight count equals the leases the director holds for expiry (none leaked).

Run (CI runs 100 000 inputs in ``test_fuzz_atheris.py``; longer runs just raise ``-runs`` or use
``-max_total_time``)::

    .venv/bin/python -m tests.extproc.fuzz_stream -runs=100000
    .venv/bin/python -m tests.extproc.fuzz_stream -max_total_time=3600 -print_final_stats=1 corpus/
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence

import atheris

with atheris.instrument_imports(include=["picker.extproc", "picker.request", "picker.control"]):
    import orjson
    from envoy.config.core.v3 import base_pb2
    from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
    from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

    from picker import errors
    from picker.app import Running, serving
    from picker.extproc.stream import Stream
    from picker.request import headers as hdr
    from tests.conftest import endpoint
    from tests.extproc.conftest import make_store, settings

MODE = processing_mode_pb2.ProcessingMode
MODES = [MODE.NONE, MODE.STREAMED, MODE.BUFFERED, MODE.BUFFERED_PARTIAL, MODE.FULL_DUPLEX_STREAMED, MODE.GRPC]
MAX_BODY = 4096
MAX_HEADERS = 4096
POOL = {f"192.168.1.{i}:8000" for i in (1, 2, 3)}
PATHS = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/conversations",
    "/vllm.grpc.engine.VllmEngine/Generate",
    "/x",
    "",
]
HEADER_NAMES = [
    ":path",
    ":method",
    ":status",
    "content-type",
    "content-length",
    hdr.REQUEST_ID,
    hdr.DESTINATION,
    hdr.DESTINATION_SERVED,
    hdr.SUBSET_KEY,
    hdr.MODEL_REWRITE,
    hdr.OBJECTIVE,
    hdr.FAIRNESS_ID,
    hdr.TEST_ENDPOINT_SELECTION,
    "x-original-path",
    "X-Mixed-Case",
    "",
]
VALUES = [
    "10.9.9.9:22",
    "192.168.1.1:8000",
    "text/event-stream",
    "application/json",
    "m\r\nx-gateway-destination-endpoint: 10.9.9.9:22",
    "\x00",
    "v" * (MAX_HEADERS + 1),
]
KEYS = ["model", "prompt", "messages", "input", "items", "max_tokens", "stream", "stream_options", "role", "content"]


def _json_value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> object:
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 4 else 4)
    if kind == 0:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 24))
    if kind == 1:
        return fdp.ConsumeInt(8)
    if kind == 2:
        return fdp.ConsumeBool()
    if kind == 3:
        return None
    if kind == 4:
        return fdp.ConsumeRegularFloat()
    if kind == 5:
        return [_json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 3))]
    return {fdp.PickValueInList(KEYS): _json_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))}


def _body(fdp: atheris.FuzzedDataProvider) -> bytes:
    kind = fdp.ConsumeIntInRange(0, 7)
    if kind <= 2:  # structured JSON, mostly shaped like a request
        doc = {fdp.PickValueInList(KEYS): _json_value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 5))}
        if fdp.ConsumeBool():
            doc["model"] = fdp.PickValueInList(["m", "", "target", "a" * 300])
        try:
            body = orjson.dumps(doc)
        except (TypeError, orjson.JSONEncodeError):
            body = b"{}"
        if kind == 2:  # duplicate model key after the first
            body = body[:-1] + (b',"model":"dup"}' if len(body) > 2 else b'"model":"dup"}')
        return body
    if kind == 3:  # deep nesting
        depth = fdp.ConsumeIntInRange(1, 3000)
        return b'{"model":"m","prompt":' + b"[" * depth + b"]" * depth + b"}"
    if kind == 4:  # invalid UTF-8 / control bytes inside a string
        return b'{"model":"m","prompt":"' + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 32)) + b'"}'
    if kind == 5:
        return b"x" * (MAX_BODY + fdp.ConsumeIntInRange(-2, 2))
    return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 256))


def _headers(fdp: atheris.FuzzedDataProvider) -> base_pb2.HeaderMap:
    hm = base_pb2.HeaderMap()
    as_value = fdp.ConsumeBool()  # the NGINX shim sends `value` strings, Envoy `raw_value` bytes
    if fdp.ConsumeBool():
        h = hm.headers.add()
        h.key = ":path"
        path = fdp.PickValueInList(PATHS)
        if as_value:
            h.value = path
        else:
            h.raw_value = path.encode()
    for _ in range(fdp.ConsumeIntInRange(0, 6)):
        h = hm.headers.add()
        h.key = fdp.PickValueInList(HEADER_NAMES) if fdp.ConsumeBool() else fdp.ConsumeUnicodeNoSurrogates(12)
        if fdp.ConsumeBool():
            raw = fdp.PickValueInList(VALUES).encode()
        else:
            raw = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 40))
        if as_value:
            h.value = raw.decode("utf-8", "replace")
        else:
            h.raw_value = raw
    return hm


def _metadata(fdp: atheris.FuzzedDataProvider, msg: pb.ProcessingRequest) -> None:
    kind = fdp.ConsumeIntInRange(0, 5)
    if kind == 0:
        hint = fdp.PickValueInList(
            [["192.168.1.2"], "192.168.1.1:8000,192.168.1.3:8000", ["10.9.9.9:22"], [], [5, None], "", 3.5]
        )
        msg.metadata_context.filter_metadata[hdr.SUBSET_NAMESPACE].update({hdr.SUBSET_KEY: hint})
    elif kind == 1:
        served = fdp.ConsumeUnicodeNoSurrogates(16)
        msg.metadata_context.filter_metadata[hdr.LB_NAMESPACE].update({hdr.DESTINATION_SERVED: served})
    elif kind == 2:
        msg.metadata_context.filter_metadata[hdr.SUBSET_NAMESPACE].update({"other": [1, "x", {"k": None}]})


def decode(data: bytes) -> list[pb.ProcessingRequest]:
    """One fuzz input → one message sequence (mostly request-shaped, so the later phases are reached)."""
    fdp = atheris.FuzzedDataProvider(data)
    msgs: list[pb.ProcessingRequest] = []
    shaped = fdp.ConsumeIntInRange(0, 3) > 0
    if shaped:
        first = pb.ProcessingRequest()
        first.request_headers.headers.CopyFrom(_headers(fdp))
        first.request_headers.end_of_stream = fdp.ConsumeIntInRange(0, 7) == 0
        if fdp.ConsumeIntInRange(0, 3) > 0:
            first.protocol_config.request_body_mode = fdp.PickValueInList(MODES)
            first.protocol_config.response_body_mode = fdp.PickValueInList(MODES)
        _metadata(fdp, first)
        msgs.append(first)
    for _ in range(fdp.ConsumeIntInRange(0, 7)):
        kind = fdp.ConsumeIntInRange(0, 6)
        msg = pb.ProcessingRequest()
        if kind in (0, 1):  # request body: the common case
            msg.request_body.body = _body(fdp)
            msg.request_body.end_of_stream = fdp.ConsumeIntInRange(0, 2) > 0
        elif kind == 2:
            msg.request_trailers.SetInParent()
        elif kind == 3:
            msg.response_headers.headers.CopyFrom(_headers(fdp))
            msg.response_headers.end_of_stream = fdp.ConsumeBool()
        elif kind == 4:
            msg.response_body.body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 200))
            msg.response_body.end_of_stream = fdp.ConsumeBool()
        elif kind == 5:
            msg.response_trailers.SetInParent()
        else:
            msg.request_headers.headers.CopyFrom(_headers(fdp))
        _metadata(fdp, msg)
        msgs.append(msg)
    return msgs


class Harness:
    """A started picker (no gRPC traffic: its director, scheduler and settings) and the per-input checks."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        store = make_store([endpoint(1, waiting=3), endpoint(2), endpoint(3, waiting=10)])
        self._cm = serving(
            settings(max_body_bytes=MAX_BODY, max_response_buffer_bytes=MAX_BODY, max_header_bytes=MAX_HEADERS),
            store=store,
            scrape=False,
        )
        self.running: Running = self.loop.run_until_complete(self._cm.__aenter__())
        self.cases = 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.run_until_complete(self._cm.__aexit__(None, None, None))
        self.loop.close()

    def leases(self) -> int:
        """In-flight requests not accounted for by a lease held for expiry (must not change across a case).

        ``len(_held)`` and not ``director.held``: the property walks every held lease (O(n) per case, quadratic
        over a run); an expiry pops an entry and releases its count together, so the difference is the same."""
        return sum(self.running.inflight.requests(key) for key in POOL) - len(self.running.director._held)

    async def _run(self, msgs: Sequence[pb.ProcessingRequest]) -> list[pb.ProcessingResponse]:
        stream = Stream(self.running.extproc.env)
        answers: list[pb.ProcessingResponse] = []
        try:
            async with asyncio.timeout(5.0):  # TimeoutError: a hung stream
                for msg in msgs:
                    answers.extend(await stream.on_message(msg))
                    if stream.done:
                        break
        finally:
            stream.close()
        return answers

    def check(self, data: bytes) -> None:
        msgs = decode(data)
        subset_hint = any(hdr.SUBSET_NAMESPACE in m.metadata_context.filter_metadata for m in msgs)
        before = self.leases()
        answers = self.loop.run_until_complete(self._run(msgs))
        self.cases += 1
        kinds = [a.WhichOneof("response") for a in answers]
        if "immediate_response" in kinds:
            assert kinds.count("immediate_response") == 1, kinds
            assert kinds[-1] == "immediate_response", f"answers after an ImmediateResponse: {kinds}"
            imm = answers[-1].immediate_response
            code = int(imm.status.code)
            assert 400 <= code < 500 or (code == 503 and subset_hint), (code, imm.body)
            prefix, sep, message = imm.body.partition(b" - ")
            assert prefix.startswith(b"inference error: "), imm.body
            assert sep, imm.body
            assert message.strip(), imm.body
        for answer in answers:
            for field in ("request_headers", "request_body"):
                if answer.HasField(field):
                    common = getattr(answer, field).response
                    for option in common.header_mutation.set_headers:
                        if option.header.key == hdr.DESTINATION:
                            assert option.header.raw_value.decode() in POOL, option.header.raw_value
        assert self.leases() == before, "in-flight lease leaked"


def main(argv: list[str]) -> None:
    logging.disable(logging.WARNING)  # the expected protocol-violation warnings would flood the output
    harness = Harness()

    def test_one_input(data: bytes) -> None:
        try:
            harness.check(data)
        except errors.PickerError as exc:  # must have become an answer inside the stream
            raise AssertionError(f"PickerError escaped the stream: {exc!r}") from exc

    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
