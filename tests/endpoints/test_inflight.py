"""picker's own ledger: leases, the request-size averages."""

from __future__ import annotations

import pytest

from picker.endpoints.inflight import DEFAULT_DECODE_TOKENS, DEFAULT_REQUEST_TOKENS, InflightTracker


def test_request_size_averages_start_at_defaults_then_follow_what_picker_routes() -> None:
    t = InflightTracker()
    assert (t.request_tokens, t.decode_tokens) == (DEFAULT_REQUEST_TOKENS, DEFAULT_DECODE_TOKENS)
    lease = t.acquire("a:1", 2112, 0.0)  # 2048 prompt + 64 answer
    assert t.request_tokens == 2112
    t.prefilled(lease, 2048)
    assert t.decode_tokens == 64
    for _ in range(200):
        t.prefilled(t.acquire("a:1", 600, 0.0), 500)
    assert t.request_tokens == pytest.approx(600, rel=1e-3)
    assert t.decode_tokens == pytest.approx(100, rel=1e-3)


def test_requests_count_as_prefilling_until_their_first_token_or_their_release() -> None:
    t = InflightTracker()
    a, b, c = (t.acquire("a:1", 100, 0.0) for _ in range(3))
    assert t.load("a:1").prefilling == 3
    t.prefilled(a, 50)
    t.prefilled(a, 50)  # a second first token changes nothing
    assert t.load("a:1").prefilling == 2
    t.release(b)  # ended (or failed) before its first token
    t.release(b)
    t.release(a)  # already prefilled: no change to the count
    assert t.prefilling_of([_Key("a:1"), _Key("b:1")]) == [1, 0]
    t.release(c)
    assert t.load("a:1").prefilling == 0
    assert t.load("a:1").requests == 0


class _Key:
    def __init__(self, key: str) -> None:
        self.key = key


def test_open_leases_are_listed_per_endpoint_oldest_first_until_released() -> None:
    tracker = InflightTracker()
    first = tracker.acquire("a:1", 30, 0.0, prefill_tokens=10, max_output_tokens=20, fixed_output=True, model="m")
    second = tracker.acquire("a:1", 5, 1.0)
    tracker.acquire("b:1", 5, 1.0)
    assert list(tracker.leases("a:1")) == [first, second]
    assert (first.prefill_tokens, first.max_output_tokens, first.fixed_output, first.model) == (10, 20, True, "m")
    tracker.prefilled(first, 10, 2.5)
    assert first.first_token_at == 2.5
    tracker.release(first)
    assert list(tracker.leases("a:1")) == [second]
    tracker.release(second)
    assert list(tracker.leases("a:1")) == []
    tracker.forget_except({"a:1"})
    assert list(tracker.leases("b:1")) == []
