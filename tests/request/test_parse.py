"""parse_request: golden bodies per API kind, the reference's error messages, byte-identical bodies."""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picker import errors
from picker.request import headers as hdr
from picker.request.model import ApiKind, Subset
from picker.request.parse import DEFAULT_FAIRNESS_ID, new_request_id, parse_request


def _body(**fields: Any) -> bytes:
    return orjson.dumps(fields)


def _path(path: str, **extra: str) -> dict[str, str]:
    return {":path": path, ":method": "POST", "x-request-id": "rid-1", **extra}


# -- golden bodies ------------------------------------------------------------------------------------------


def test_completions_golden() -> None:
    body = b'{"max_tokens":100,"model":"my-model","prompt":"hello world","temperature":0}'
    req = parse_request(_path("/v1/completions"), body)
    assert req.api is ApiKind.COMPLETIONS
    assert req.model == req.target_model == "my-model"
    assert req.prompt_text == "hello world"
    assert req.prompt_tokens == 2  # 11 chars / 4
    assert req.max_tokens == 100
    assert req.stream is False
    assert req.request_id == "rid-1"
    assert req.body is body  # the original bytes, not a copy or a re-serialisation
    assert req.body_json == {"max_tokens": 100, "model": "my-model", "prompt": "hello world", "temperature": 0}
    assert req.priority == 0


def test_completions_prompt_list_is_joined_with_spaces() -> None:
    req = parse_request(_path("/v1/completions"), _body(model="m", prompt=["a b", "c"]))
    assert req.prompt_text == "a b c"


def test_completions_token_id_prompt_counts_tokens_exactly() -> None:
    req = parse_request(_path("/v1/completions"), _body(model="m", prompt=[1, 2, 3, 4, 5]))
    assert req.prompt_tokens == 5
    assert req.prompt_text == "[1,2,3,4,5]"


def test_chat_golden() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    body = _body(model="llama", messages=messages, stream=True, max_completion_tokens=7)
    req = parse_request(_path("/v1/chat/completions"), body)
    assert req.api is ApiKind.CHAT_COMPLETIONS
    assert req.prompt_text == orjson.dumps(messages).decode()
    assert req.prompt_tokens == len(req.prompt_text) // 4
    assert req.stream is True
    assert req.max_tokens == 7


def test_responses_golden_text_is_instructions_tools_input() -> None:
    body = _body(
        model="m", instructions="be nice", tools=[{"type": "web_search"}], input="question", max_output_tokens=9
    )
    req = parse_request(_path("/v1/responses"), body)
    assert req.api is ApiKind.RESPONSES
    expected = [{"instructions": "be nice"}, {"tools": [{"type": "web_search"}]}, {"input": "question"}]
    assert orjson.loads(req.prompt_text) == expected
    assert req.max_tokens == 9


def test_responses_without_instructions_hashes_only_input() -> None:
    req = parse_request(_path("/v1/responses"), _body(model="m", input=[{"role": "user", "content": "x"}]))
    assert orjson.loads(req.prompt_text) == [{"input": [{"role": "user", "content": "x"}]}]


def test_conversations_golden() -> None:
    items = [{"type": "message", "role": "user", "content": "hi"}]
    req = parse_request(_path("/v1/conversations"), _body(model="m", items=items))
    assert req.api is ApiKind.CONVERSATIONS
    assert req.prompt_text == orjson.dumps(items).decode()


def test_embeddings_golden() -> None:
    req = parse_request(_path("/v1/embeddings"), _body(model="e5", input=["a", "b"]))
    assert req.api is ApiKind.EMBEDDINGS
    assert req.prompt_text == '["a","b"]'
    assert req.max_tokens is None


@pytest.mark.parametrize(
    ("path", "api"),
    [
        ("/v1/chat/completions", ApiKind.CHAT_COMPLETIONS),
        ("/v1/chat/completions?x=1", ApiKind.CHAT_COMPLETIONS),
        ("/openai/v1/chat/completions/", ApiKind.CHAT_COMPLETIONS),
        ("/v1/completions", ApiKind.COMPLETIONS),
        ("/v1/embeddings", ApiKind.EMBEDDINGS),
        ("/v1/responses", ApiKind.RESPONSES),
        ("/v1/conversations", ApiKind.CONVERSATIONS),
        ("/v1/projects/p/locations/l/chat/completions", ApiKind.CHAT_COMPLETIONS),
        ("/generate", ApiKind.COMPLETIONS),  # unmatched path: the reference's default
    ],
)
def test_api_kind_from_path(path: str, api: ApiKind) -> None:
    body = _body(model="m", prompt="p", messages=[{"role": "user", "content": "x"}], input="i", items=[1])
    assert parse_request({":path": path}, body).api is api


@pytest.mark.parametrize("header", [hdr.ORIGINAL_PATH, hdr.FORWARDED_PATH])
def test_path_fallback_headers(header: str) -> None:
    req = parse_request({header: "/v1/chat/completions"}, _body(model="m", messages=[{"role": "user"}]))
    assert req.api is ApiKind.CHAT_COMPLETIONS


@pytest.mark.parametrize(
    ("fields", "api"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, ApiKind.CHAT_COMPLETIONS),
        ({"prompt": "x"}, ApiKind.COMPLETIONS),
        ({"input": "x", "instructions": "y"}, ApiKind.RESPONSES),
        ({"input": "x", "previous_response_id": "r1"}, ApiKind.RESPONSES),
        ({"input": "x"}, ApiKind.EMBEDDINGS),
        ({"input": ["x"], "encoding_format": "float"}, ApiKind.EMBEDDINGS),
        ({"items": [{"type": "message"}]}, ApiKind.CONVERSATIONS),
    ],
)
def test_api_kind_from_shape_without_path(fields: dict[str, Any], api: ApiKind) -> None:
    # The NGINX Gateway Fabric shim sends no :path at all.
    assert parse_request({}, _body(model="m", **fields)).api is api


def test_no_path_and_no_known_shape_fails_as_completions() -> None:
    with pytest.raises(errors.BadRequest, match=r"^invalid completions request: must have prompt field$"):
        parse_request({}, _body(model="m", foo=1))


# -- errors: exactly the reference's messages ---------------------------------------------------------------


@pytest.mark.parametrize("body", [b"{", b"not json", b"\xff\xfe", b'{"model": "m",}', b"1e400"])
def test_not_json(body: bytes) -> None:
    with pytest.raises(errors.BadRequest) as info:
        parse_request(_path("/v1/completions"), body)
    assert info.value.message.startswith("error unmarshaling request bodyMap: ")
    assert info.value.wire_text.startswith("inference error: BadRequest - error unmarshaling request bodyMap: ")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"null", b"42", b"true"])
def test_json_that_is_not_an_object(body: bytes) -> None:
    with pytest.raises(errors.BadRequest, match=r"^error unmarshaling request bodyMap: expected a JSON object"):
        parse_request(_path("/v1/completions"), body)


@pytest.mark.parametrize("model", [None, "", 5, ["m"], {"name": "m"}, True])
def test_model_missing_or_not_a_string(model: Any) -> None:
    fields: dict[str, Any] = {"prompt": "hello world"}
    if model is not None:
        fields["model"] = model
    with pytest.raises(errors.BadRequest) as info:
        parse_request(_path("/v1/completions"), _body(**fields))
    assert info.value.message == "model not found in request body"
    assert info.value.status == 400


def test_reference_case_8_prompt_without_model() -> None:
    with pytest.raises(errors.BadRequest, match=r"^model not found in request body$"):
        parse_request({"x-request-id": "test-request-id"}, b'{"prompt":"hello world"}')


CHAT_ERROR = "invalid chat completions request: must have valid messages field"


@pytest.mark.parametrize(
    ("path", "fields", "message"),
    [
        ("/v1/chat/completions", {}, CHAT_ERROR),
        ("/v1/chat/completions", {"messages": []}, CHAT_ERROR),
        ("/v1/chat/completions", {"messages": "hi"}, CHAT_ERROR),
        ("/v1/chat/completions", {"messages": [1]}, CHAT_ERROR),
        ("/v1/chat/completions", {"messages": [{"role": 123, "content": "x"}]}, CHAT_ERROR),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, CHAT_ERROR),
        ("/v1/completions", {}, "invalid completions request: must have prompt field"),
        ("/v1/completions", {"prompt": ""}, "invalid completions request: must have prompt field"),
        ("/v1/completions", {"prompt": []}, "invalid completions request: must have prompt field"),
        ("/v1/completions", {"prompt": 7}, "invalid completions request: must have prompt field"),
        ("/v1/completions", {"prompt": ["a", 1]}, "invalid completions request: must have prompt field"),
        ("/v1/embeddings", {"input": ""}, "invalid embeddings request: must have input field"),
        ("/v1/embeddings", {"input": []}, "invalid embeddings request: must have input field"),
        ("/v1/responses", {"input": None}, "invalid responses request: must have input field"),
        ("/v1/responses", {}, "invalid responses request: must have input field"),
        ("/v1/conversations", {"items": []}, "invalid conversations request: must have items field"),
        ("/v1/conversations", {"items": "x"}, "invalid conversations request: must have items field"),
    ],
)
def test_bad_shape(path: str, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(errors.BadRequest) as info:
        parse_request(_path(path), _body(model="m", **fields))
    assert info.value.message == message


def test_shape_is_checked_before_model_as_the_reference() -> None:
    with pytest.raises(errors.BadRequest, match="must have valid messages field"):
        parse_request(_path("/v1/chat/completions"), b"{}")


def test_body_over_the_limit_is_payload_too_large() -> None:
    body = _body(model="m", prompt="x" * 100)
    with pytest.raises(errors.PayloadTooLarge) as info:
        parse_request(_path("/v1/completions"), body, max_body_bytes=50)
    assert info.value.status == 413
    assert f"{len(body)} bytes" in info.value.message
    assert "50 bytes" in info.value.message
    assert parse_request(_path("/v1/completions"), body, max_body_bytes=len(body)).model == "m"


# -- header-only, passthrough, headers ----------------------------------------------------------------------


def test_empty_body_is_a_header_only_request() -> None:
    req = parse_request({":path": "/v1/models", "x-request-id": "r"}, b"")
    assert req.api is ApiKind.NONE
    assert req.model == req.target_model == ""
    assert req.body == b""
    assert req.body_json is None
    assert req.prompt_tokens == 0


def test_passthrough_keeps_the_body_and_parses_nothing() -> None:
    body = b'{"not": "even checked", "model": 5'  # invalid JSON is fine: nothing is parsed
    req = parse_request(_path("/v1/completions"), body, parser="passthrough")
    assert req.api is ApiKind.NONE
    assert req.model == ""
    assert req.body is body
    assert req.body_json is None
    assert parse_request({}, body, parser="passthrough-parser").body is body


def test_unknown_parser_name_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown parser"):
        parse_request({}, b"{}", parser="vllmgrpc")


def test_request_id_generated_when_absent() -> None:
    req = parse_request({}, _body(model="m", prompt="p"))
    assert uuid.UUID(req.request_id).version == 4


def test_generated_request_ids_are_canonical_random_uuid4s() -> None:
    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)
        assert str(parsed) == text  # lower-case hex, dashes where str(uuid4()) puts them
    # All four variant digits and every other digit occur: the bits outside version/variant are random.
    assert {text[19] for text in ids} == set("89ab")
    assert {c for text in ids for c in text[24:]} == set("0123456789abcdef")


def test_request_id_is_case_insensitive() -> None:
    assert parse_request({"X-Request-ID": "abc"}, _body(model="m", prompt="p")).request_id == "abc"


def test_objective_fairness_subset_and_headers_kept() -> None:
    headers = _path("/v1/completions", **{hdr.OBJECTIVE: "sql-lora", hdr.FAIRNESS_ID: "tenant-a", "hi": "mom"})
    subset = Subset(addresses=frozenset({"10.0.0.1"}))
    req = parse_request(headers, _body(model="m", prompt="p"), subset=subset)
    assert req.objective == "sql-lora"
    assert req.fairness_id == "tenant-a"
    assert req.subset is subset
    assert req.headers["hi"] == "mom"
    assert req.priority == 0  # the director applies objectives


def test_fairness_defaults() -> None:
    req = parse_request({hdr.FAIRNESS_ID: ""}, _body(model="m", prompt="p"))
    assert req.fairness_id == DEFAULT_FAIRNESS_ID == "default-flow"
    assert req.objective is None


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 5}, 5),
        ({"max_completion_tokens": 6, "max_tokens": 5}, 6),
        ({"max_output_tokens": 4}, 4),
        ({"max_tokens": 5.0}, 5),
        ({"max_tokens": True}, None),
        ({"max_tokens": -1}, None),
        ({"max_tokens": "5"}, None),
        ({}, None),
    ],
)
def test_max_tokens(fields: dict[str, Any], expected: int | None) -> None:
    assert parse_request(_path("/v1/completions"), _body(model="m", prompt="p", **fields)).max_tokens == expected


@pytest.mark.parametrize(("stream", "expected"), [(True, True), (False, False), ("true", False), (1, False)])
def test_stream_flag_only_when_true(stream: Any, expected: bool) -> None:
    assert parse_request(_path("/v1/completions"), _body(model="m", prompt="p", stream=stream)).stream is expected


def test_prompt_tokens_at_least_one_for_any_text() -> None:
    assert parse_request(_path("/v1/completions"), _body(model="m", prompt="a")).prompt_tokens == 1


def test_body_bytes_are_never_reserialised() -> None:
    # Key order, spacing, escapes and number spelling survive untouched.
    body = b'{ "prompt" : "caf\\u00e9 <&>",\n  "model":"m", "temperature": 1.0e0, "z": 1, "a": 2 }'
    req = parse_request(_path("/v1/completions"), body)
    assert req.body == body
    assert req.prompt_text == "café <&>"


# -- robustness ---------------------------------------------------------------------------------------------

_HEADER_KEYS = st.sampled_from([":path", "x-original-path", "x-request-id", hdr.OBJECTIVE, hdr.FAIRNESS_ID, "x"])
_PATHS = st.sampled_from(
    ["/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/responses", "/v1/conversations", "/", "?"]
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_KEYS = st.sampled_from(
    ["model", "prompt", "messages", "input", "items", "instructions", "tools", "stream", "max_tokens", "cache_salt"]
)


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=300), headers=st.dictionaries(_HEADER_KEYS, _PATHS | st.text(max_size=20)))
def test_random_bytes_only_raise_bad_request(body: bytes, headers: dict[str, str]) -> None:
    with contextlib.suppress(errors.BadRequest, errors.PayloadTooLarge):
        parse_request(headers, body, max_body_bytes=200)


@settings(max_examples=150, deadline=None)
@given(doc=st.dictionaries(_KEYS, _JSON, max_size=6), path=st.none() | _PATHS)
def test_random_objects_only_raise_bad_request(doc: dict[str, Any], path: str | None) -> None:
    headers = {} if path is None else {":path": path}
    body = orjson.dumps(doc)
    try:
        req = parse_request(headers, body)
    except errors.BadRequest:
        return
    assert req.body is body
    assert isinstance(req.model, str)
    assert req.model
    assert req.prompt_tokens >= 1


@pytest.mark.parametrize(
    ("extra", "fixed"),
    [
        ({"max_tokens": 512, "ignore_eos": True}, True),
        ({"max_tokens": 512, "min_tokens": 512}, True),
        ({"max_tokens": 512, "min_tokens": 600}, True),
        ({"max_tokens": 512, "min_tokens": 10}, False),
        ({"max_tokens": 512}, False),
        ({"ignore_eos": True}, False),  # no length to fix it at
        ({"max_tokens": 512, "min_tokens": True}, False),
    ],
)
def test_an_answer_is_fixed_at_max_tokens_with_ignore_eos_or_min_tokens(extra: dict[str, Any], fixed: bool) -> None:
    req = parse_request(_path("/v1/completions"), _body(model="m", prompt="hello", **extra))
    assert req.fixed_output is fixed
