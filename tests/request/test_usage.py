"""Usage from JSON responses and SSE streams (incl. a data line split across chunks), TTFT signals."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from picker.request.usage import SSEUsageScanner, Usage, json_usage


def test_chat_json_usage_with_cached_tokens() -> None:
    body = orjson.dumps(
        {
            "object": "chat.completion",
            "usage": {
                "prompt_tokens": 7,
                "completion_tokens": 10,
                "total_tokens": 17,
                "prompt_tokens_details": {"cached_tokens": 4},
            },
        }
    )
    assert json_usage(body) == Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17, cached_tokens=4)


def test_singular_details_key_is_not_read() -> None:
    # The reference reads usage.prompt_token_details (singular), which nobody emits: a documented defect.
    body = b'{"usage":{"prompt_tokens":7,"prompt_token_details":{"cached_tokens":4}}}'
    usage = json_usage(body)
    assert usage is not None
    assert usage.cached_tokens == 0


def test_responses_json_usage() -> None:
    body = (
        b'{"object":"response","usage":{"input_tokens":31,"output_tokens":5,"total_tokens":36,'
        b'"input_tokens_details":{"cached_tokens":16}}}'
    )
    assert json_usage(body) == Usage(prompt_tokens=31, completion_tokens=5, total_tokens=36, cached_tokens=16)


def test_total_is_derived_when_absent() -> None:
    assert json_usage(b'{"usage":{"prompt_tokens":3,"completion_tokens":4}}') == Usage(3, 4, 7, 0)


def test_no_usage_or_not_json() -> None:
    assert json_usage(b'{"id":"x"}') is None
    assert json_usage(b'{"usage":null}') is None
    assert json_usage(b"not json") is None
    assert json_usage(b"[1]") is None


def test_reference_case_14_sse_usage() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b"data: {}\n\n")
    scanner.feed(b'data: {"usage":{"prompt_tokens":7,"total_tokens":17,"completion_tokens":10}}\ndata: [DONE]\n')
    scanner.feed(b"")
    scanner.close()
    assert scanner.usage == Usage(prompt_tokens=7, completion_tokens=10, total_tokens=17)
    assert scanner.done


def test_data_line_split_across_two_chunks() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b'data: {"choices":[{"text":"hi"}]}\n\ndata: {"choices":[],"usa')
    assert scanner.usage is None
    scanner.feed(b'ge":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}\n\ndata: [DONE]\n\n')
    assert scanner.usage == Usage(5, 2, 7, 0)


def test_first_usage_wins() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b'data: {"usage":{"prompt_tokens":1}}\ndata: {"usage":{"prompt_tokens":2}}\n')
    assert scanner.usage is not None
    assert scanner.usage.prompt_tokens == 1


def test_null_usage_chunks_are_skipped() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b'data: {"choices":[{"delta":{"content":"a"}}],"usage":null}\n\n')
    assert scanner.usage is None
    scanner.feed(b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1}}\n\n')
    assert scanner.usage == Usage(9, 1, 10, 0)


def test_responses_api_completed_event() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b"event: response.output_text.delta\n")
    scanner.feed(b'data: {"type":"response.output_text.delta","delta":"Hi"}\n\n')
    assert scanner.first_token_seen
    scanner.feed(b"event: response.completed\n")
    scanner.feed(b'data: {"type":"response.completed","response":{"usage":{"input_tokens":31,"output_tokens":2}}}\n')
    assert scanner.usage == Usage(31, 2, 33, 0)
    assert scanner.done


def test_first_event_and_first_token() -> None:
    scanner = SSEUsageScanner()
    assert not scanner.first_event_seen
    scanner.feed(b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n')
    assert scanner.first_event_seen
    assert not scanner.first_token_seen  # a role header is not a token
    scanner.feed(b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n')
    assert scanner.first_token_seen
    assert scanner.events == 2


def test_crlf_and_no_space_after_colon() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b'data:{"usage":{"prompt_tokens":3,"completion_tokens":1}}\r\n\r\n')
    assert scanner.usage == Usage(3, 1, 4, 0)


def test_overlong_line_is_dropped_not_buffered() -> None:
    scanner = SSEUsageScanner(max_line_bytes=64)
    scanner.feed(b'data: {"usage":{"prompt_tokens":1,"pad":"' + b"x" * 40)
    scanner.feed(b"y" * 100)
    assert len(scanner._partial) == 0  # the cap held
    scanner.feed(b'"}}\ndata: {"usage":{"prompt_tokens":2}}\n')
    assert scanner.usage is not None
    assert scanner.usage.prompt_tokens == 2


def test_last_line_without_newline_counts_on_close() -> None:
    scanner = SSEUsageScanner()
    scanner.feed(b'data: {"usage":{"prompt_tokens":4}}')
    assert scanner.usage is None
    scanner.close()
    assert scanner.usage is not None
    assert scanner.usage.prompt_tokens == 4


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_any_chunking_gives_the_same_usage(cuts: list[int]) -> None:
    stream = (
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"b"}}],"usage":null}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":2,"total_tokens":13}}\n\n'
        b"data: [DONE]\n\n"
    )
    points = sorted({min(c, len(stream)) for c in cuts})
    scanner = SSEUsageScanner()
    prev = 0
    for p in [*points, len(stream)]:
        scanner.feed(stream[prev:p])
        prev = p
    scanner.close()
    assert scanner.usage == Usage(11, 2, 13, 0)
    assert scanner.first_token_seen
    assert scanner.done
    assert scanner.events == 3
