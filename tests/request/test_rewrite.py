"""rewrite_model patches only the top-level model; restore_model / SSEModelRestorer put the client's name back."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picker.request.parse import parse_request
from picker.request.rewrite import SSEModelRestorer, restore_model, rewrite_model


def _parse(body: bytes) -> Any:
    return parse_request({":path": "/v1/completions"}, body)


def test_only_the_model_value_changes() -> None:
    body = b'{ "prompt" : "say \\"model\\": \\"a\\" {[", "model" :  "a",\n "n": [1, {"model": "a"}], "t": 0.50 }'
    req = rewrite_model(_parse(body), "rewritten-model")
    assert req.body == body.replace(b'"model" :  "a"', b'"model" :  "rewritten-model"')
    assert req.target_model == "rewritten-model"
    assert req.model == "a"  # the incoming name stays for metrics and the response path
    assert req.body_json is not None
    assert req.body_json["model"] == "rewritten-model"
    assert req.body_json["n"] == [1, {"model": "a"}]
    assert orjson.loads(req.body) == req.body_json


def test_prompt_mentioning_model_is_untouched_when_model_comes_first() -> None:
    body = b'{"model":"a","prompt":"{\\"model\\":\\"a\\"} model a"}'
    req = rewrite_model(_parse(body), "b")
    assert req.body == b'{"model":"b","prompt":"{\\"model\\":\\"a\\"} model a"}'


def test_target_is_json_escaped() -> None:
    req = rewrite_model(_parse(b'{"model":"a","prompt":"p"}'), 'we"ird\\name')
    assert orjson.loads(req.body)["model"] == 'we"ird\\name'


def test_escaped_key_and_duplicate_keys_are_all_patched() -> None:
    body = b'{"mod\\u0065l":"a","prompt":"p","model":"a"}'
    req = rewrite_model(_parse(body), "b")
    assert req.body == b'{"mod\\u0065l":"b","prompt":"p","model":"b"}'


def test_same_model_keeps_the_request() -> None:
    req = _parse(b'{"model":"a","prompt":"p"}')
    assert rewrite_model(req, "a") is req


def test_header_only_request_only_sets_target() -> None:
    req = rewrite_model(parse_request({}, b""), "b")
    assert req.target_model == "b"
    assert req.body == b""


def test_passthrough_body_is_not_touched() -> None:
    body = b'{"model":"a","prompt":"p"}'
    req = rewrite_model(parse_request({}, body, parser="passthrough"), "b")
    assert req.body is body
    assert req.target_model == "b"


@pytest.mark.parametrize(
    "value",
    [b'"a"', b"5", b"null", b"[1, 2]", b'{"x": "}"}', b"true"],
)
def test_non_string_model_values_are_replaced_whole(value: bytes) -> None:
    # A body whose model is not a string never passes parse; build the request by hand.
    from dataclasses import replace

    base = _parse(b'{"model":"a","prompt":"p"}')
    body = b'{"prompt":"p","model":' + value + b',"z":1}'
    req = replace(base, body=body, body_json=orjson.loads(body))
    out = rewrite_model(req, "b")
    assert orjson.loads(out.body) == {"prompt": "p", "model": "b", "z": 1}


_NESTED = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=150, deadline=None)
@given(
    prompt=st.text(min_size=1),
    extra=st.dictionaries(st.text(max_size=6), _NESTED, max_size=4),
    target=st.text(min_size=1, max_size=12),
    indent=st.booleans(),
)
def test_rewrite_changes_exactly_the_model(prompt: str, extra: dict[str, Any], target: str, indent: bool) -> None:
    doc: dict[str, Any] = {**extra, "prompt": prompt, "model": "orig"}
    body = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    out = rewrite_model(_parse(body), target)
    expected = {**doc, "model": target}
    assert orjson.loads(out.body) == expected
    assert list(orjson.loads(out.body)) == list(doc)  # key order preserved


# -- response path ------------------------------------------------------------------------------------------


def test_restore_json_response() -> None:
    body = b'{"id":"x","object":"text_completion","model":"rewritten-model","choices":[{"text":"model"}]}'
    out = restore_model(body, "rewritten-model", "model-to-be-rewritten")
    assert out == body.replace(b'"model":"rewritten-model"', b'"model":"model-to-be-rewritten"')


def test_restore_only_top_level_and_only_the_target() -> None:
    body = b'{"model": "other", "choices":[{"model":"t"}], "text": "\\"model\\":\\"t\\""}'
    assert restore_model(body, "t", "in") is body


def test_restore_unparseable_passes_unchanged() -> None:
    body = b'{"model":"t", "broken'
    assert restore_model(body, "t", "in") is body
    assert restore_model(b"", "t", "in") == b""


def test_restore_sse_lines() -> None:
    text = (
        b'data: {"id":1,"model":"t","choices":[{"text":"a"}]}\r\n\r\n'
        b"event: x\n"
        b'data: {"model":"t","usage":{"prompt_tokens":1}}\n\n'
        b"data: [DONE]\n\n"
    )
    out = restore_model(text, "t", "in")
    assert out == text.replace(b'"model":"t"', b'"model":"in"')


def test_sse_restorer_handles_a_line_split_across_chunks() -> None:
    restorer = SSEModelRestorer("t", "in")
    first = restorer.feed(b'data: {"id":1,"model":"t"}\n\ndata: {"id":2,"mo')
    second = restorer.feed(b'del":"t"}\n\n')
    tail = restorer.flush()
    assert first == b'data: {"id":1,"model":"in"}\n\n'
    assert second == b'data: {"id":2,"model":"in"}\n\n'
    assert tail == b""


def test_sse_restorer_flushes_a_last_line_without_newline() -> None:
    restorer = SSEModelRestorer("t", "in")
    assert restorer.feed(b'data: {"model":"t"}') == b""
    assert restorer.flush() == b'data: {"model":"in"}'


def test_sse_restorer_does_not_hold_an_overlong_line() -> None:
    restorer = SSEModelRestorer("t", "in", max_line_bytes=10)
    chunk = b"data: " + b"x" * 50
    assert restorer.feed(chunk) == chunk


def test_sse_restorer_noop_when_names_equal() -> None:
    restorer = SSEModelRestorer("m", "m")
    assert restorer.feed(b'data: {"model":"m"') == b'data: {"model":"m"'


_PIECES = st.sampled_from(
    [b"data:", b"data: ", b"{", b"}", b'"model"', b":", b'"t"', b",", b"\n", b"\r\n", b"[DONE]", b"\\", b'"', b" "]
)


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(_PIECES | st.binary(max_size=8), max_size=30))
def test_restore_never_raises_and_only_touches_model_values(pieces: list[bytes]) -> None:
    body = b"".join(pieces)
    out = restore_model(body, "t", "incoming")
    assert out.replace(b'"incoming"', b'"t"') == body
    restorer = SSEModelRestorer("t", "incoming")
    streamed = b"".join(restorer.feed(p) for p in pieces) + restorer.flush()
    assert streamed.replace(b'"incoming"', b'"t"') == body
