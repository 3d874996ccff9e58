"""Hostile and malformed requests, one named case each, over real gRPC: a clear 4xx with a message, or a request
routed safely; never a crash, a hang, a leaked lease, a client-chosen destination or a header that smuggles a line.
The coverage-guided fuzzer (fuzz_stream.py, test_fuzz_atheris.py) explores the same surface at random."""

from __future__ import annotations

import orjson
import pytest

from picker.app import Running
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, picker
from tests.extproc.gateway import EnvoyBuffered, EnvoyFullDuplex, Gateway, NginxShim, gateway

PATH = {":path": "/v1/completions"}
GOOD = b'{"model":"m","prompt":"hello","max_tokens":5}'
MAX_BODY = 4096
MAX_HEADERS = 2048


async def _request(
    cls: type[Gateway], running: Running, headers: dict[str, str], body: bytes, subset: object = None
) -> tuple[int | None, bytes, str | None, dict[str, str], list[str]]:
    async with gateway(cls, running.grpc_target) as gw:
        out = await gw.request(headers, [body] if body else [], subset=subset)
    return out.status, out.error_body, out.destination, out.set_headers, out.removed


@pytest.fixture
async def running():  # type: ignore[no-untyped-def]
    store = make_store([endpoint(1, waiting=5), endpoint(2), endpoint(3, waiting=9)])
    async with picker(store, max_body_bytes=MAX_BODY, max_header_bytes=MAX_HEADERS, retry_after_s=7) as r:
        yield r
        leased = sum(r.inflight.requests(f"192.168.1.{i}:8000") for i in (1, 2, 3))
        assert leased == r.director.held, "a rejected request left an in-flight lease behind"


BAD = [
    ("oversized body", PATH, b'{"model":"m","prompt":"' + b"x" * MAX_BODY + b'"}', 413, "exceeds the limit"),
    ("oversized headers", {**PATH, "x-big": "v" * MAX_HEADERS}, GOOD, 431, "request headers exceed"),
    ("many small headers", {**PATH, **{f"x-h{i}": "v" * 40 for i in range(60)}}, GOOD, 431, "request headers exceed"),
    ("deeply nested JSON", PATH, b'{"model":"m","prompt":' + b"[" * 1500 + b"]" * 1500 + b"}", 400, "bodyMap"),
    ("invalid UTF-8", PATH, b'{"model":"m","prompt":"\xff\xfe"}', 400, "bodyMap"),
    ("lone surrogate escape", PATH, b'{"model":"m","prompt":"\\ud800"}', 400, "bodyMap"),
    ("not an object", PATH, b'["model","m"]', 400, ""),
    ("truncated JSON", PATH, b'{"model":"m","prompt":"hel', 400, "bodyMap"),
    ("no model", PATH, b'{"prompt":"hello"}', 400, "model not found in request body"),
    ("model not a string", PATH, b'{"model":["m"],"prompt":"hello"}', 400, "model"),
    ("NUL bytes", PATH, b'{"model":"m","prompt":"a\x00b"}', 400, "bodyMap"),
    ("empty prompt", PATH, b'{"model":"m","prompt":""}', 400, ""),
]


@pytest.mark.parametrize(("case", "headers", "body", "status", "message"), BAD, ids=[c[0] for c in BAD])
@pytest.mark.parametrize("cls", [EnvoyFullDuplex, EnvoyBuffered, NginxShim], ids=lambda c: c.__name__)
async def test_bad_input_gets_a_clear_4xx(
    running: Running,
    cls: type[Gateway],
    case: str,
    headers: dict[str, str],
    body: bytes,
    status: int,
    message: str,
) -> None:
    got, error_body, destination, _, _ = await _request(cls, running, headers, body)
    assert got == status, (case, got, error_body[:200])
    assert error_body.startswith(b"inference error: ")
    assert message.encode() in error_body
    assert len(error_body) < 600, "the error echoes no large part of the input"
    assert destination is None


@pytest.mark.parametrize("cls", [EnvoyFullDuplex, EnvoyBuffered, NginxShim], ids=lambda c: c.__name__)
async def test_spoofed_destination_and_control_headers_are_overridden_and_removed(
    running: Running, cls: type[Gateway]
) -> None:
    headers = {
        **PATH,
        "x-gateway-destination-endpoint": "10.9.9.9:22",
        "x-gateway-destination-endpoint-served": "10.9.9.9:22",
        "x-gateway-destination-endpoint-subset": "10.9.9.9:22",
    }
    _, _, destination, set_headers, removed = await _request(cls, running, headers, GOOD)
    assert destination == "192.168.1.2:8000"  # the least loaded, not the client's pick
    assert set_headers.get("x-gateway-destination-endpoint", destination) == "192.168.1.2:8000"
    if cls is not NginxShim:  # the shim applies no mutation but the destination
        assert "x-gateway-destination-endpoint-subset" in removed
        assert "x-gateway-destination-endpoint-served" in removed


async def test_duplicate_model_keys_route_and_rewrite_by_the_last_one_as_servers_read_it(running: Running) -> None:
    body = b'{"model":"first","prompt":"hello","model":"m"}'
    assert orjson.loads(body)["model"] == "m"  # what vLLM (Python json) reads too
    async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:
        out = await gw.request({**PATH, "x-gateway-model-name-rewrite": "target"}, [body])
    assert out.destination is not None
    assert out.upstream_body is not None
    assert orjson.loads(out.upstream_body)["model"] == "target"
    assert b'"first"' not in out.upstream_body, "every model key is rewritten: no server can read another model"


@pytest.mark.parametrize(
    "value",
    ["m\r\nx-gateway-destination-endpoint: 10.9.9.9:22", "m\nInjected: yes", "m\rX: y"],
    ids=["crlf", "lf", "cr"],
)
async def test_header_injection_through_the_model_rewrite_header_cannot_split_headers(
    running: Running, value: str
) -> None:
    async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:
        out = await gw.request({**PATH, "x-gateway-model-name-rewrite": value}, [GOOD])
    assert out.destination == "192.168.1.2:8000"
    for key, header_value in out.set_headers.items():
        assert not {"\r", "\n"} & set(key + header_value), (key, header_value)
    assert out.upstream_body is not None
    # The name lands JSON-escaped in the body (a model of that odd name), never as raw bytes.
    assert orjson.loads(out.upstream_body)["model"] == value
    assert b"\r" not in out.upstream_body
    assert b"\n" not in out.upstream_body


async def test_injected_request_id_is_not_echoed(running: Running) -> None:
    async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:
        out = await gw.request({**PATH, "x-request-id": "abc\r\nx-evil: 1"}, [GOOD])
    assert out.destination == "192.168.1.2:8000"
    assert "x-request-id" not in out.set_headers  # the client's own header passes as the gateway has it


@pytest.mark.parametrize(
    ("subset", "status", "destination"),
    [
        (["192.168.1.3"], None, "192.168.1.3:8000"),
        ("192.168.1.1:8000,192.168.1.3:8000", None, "192.168.1.1:8000"),
        (["10.9.9.9:22"], 503, None),  # names nothing in the pool: never routed outside it
        ([], 503, None),
        ([5, True, None, {"a": 1}], 503, None),  # nothing usable in it
        ("", 503, None),
        ("192.168.1.2:8000\r\n10.9.9.9:22", 503, None),  # one odd item, matching nothing
    ],
    ids=["ip", "comma-string", "outside-pool", "empty-list", "junk-types", "empty-string", "crlf"],
)
async def test_subset_hints_only_ever_narrow_the_pool(
    running: Running, subset: object, status: int | None, destination: str | None
) -> None:
    got, error_body, dest, _, _ = await _request(EnvoyFullDuplex, running, PATH, GOOD, subset=subset)
    assert (got, dest) == (status, destination), error_body
    if status == 503:
        assert b"failed to find endpoint candidates" in error_body


async def test_retry_after_rides_on_503_and_429_only(running: Running) -> None:
    async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:
        out = await gw.request(PATH, [GOOD], subset=["10.9.9.9"])
        bad = await gw.request(PATH, [b"{"])
    assert out.status == 503
    imm = out.answers[-1].immediate_response
    assert [(h.header.key, h.header.raw_value) for h in imm.headers.set_headers] == [("retry-after", b"7")]
    assert bad.status == 400
    assert not bad.answers[-1].immediate_response.headers.set_headers
