"""relative-ttft-scorer: a server slower than the pool for the same work scores lower; jitter, LoRA loads and old
observations change nothing."""

from __future__ import annotations

import itertools

import pytest

from picker.endpoints.model import Endpoint
from picker.plugins import CycleState, InferenceRequest, ResponseInfo, SchedulingResult
from picker.scheduling.plugins import relative_ttft
from picker.scheduling.plugins.relative_ttft import Params, RelativeTtftScorer, size_class
from tests.conftest import FakeClock, endpoint, request
from tests.scheduling.helpers import by_key, ctx

_ids = itertools.count()


def make(**params: float) -> tuple[RelativeTtftScorer, FakeClock]:
    c = ctx()
    assert isinstance(c.clock, FakeClock)
    return RelativeTtftScorer("relative-ttft-scorer", Params(**params), c), c.clock


def respond(
    scorer: RelativeTtftScorer,
    target: Endpoint,
    ttft_s: float,
    *,
    prompt: int = 300,
    lora: str = "",
    streamed: bool = True,
    output: int = 64,
    cached: int = 0,
) -> None:
    """One request through the hooks in the director's order: the pick, the first token (streamed), the end."""
    req = pick(scorer, target, prompt=prompt, lora=lora, stream=streamed)
    if streamed:
        scorer.first_token(req, ResponseInfo(target.key, ttft_s=ttft_s))
    complete(scorer, req, target, ttft_s, prompt=prompt, streamed=streamed, output=output, cached=cached)


def answer_rounds(scorer: RelativeTtftScorer, eps: list[Endpoint], ttfts: tuple[float, ...], rounds: int) -> None:
    """``rounds`` times, one response from each endpoint with its TTFT."""
    for _ in range(rounds):
        for e, ttft in zip(eps, ttfts, strict=True):
            respond(scorer, e, ttft)


def pick(
    scorer: RelativeTtftScorer, target: Endpoint, *, prompt: int = 300, lora: str = "", stream: bool = True
) -> InferenceRequest:
    req = request(model=lora or "my-model", request_id=f"r{next(_ids)}", prompt_tokens=prompt, stream=stream)
    result = SchedulingResult(targets=(target,), primary_profile="default", runs=(), profile_results={})
    scorer.pre_request(req, result)
    return req


def complete(
    scorer: RelativeTtftScorer,
    req: InferenceRequest,
    target: Endpoint,
    ttft_s: float,
    *,
    prompt: int = 300,
    streamed: bool = True,
    output: int = 64,
    cached: int = 0,
) -> None:
    info = ResponseInfo(
        target.key,
        status=200,
        prompt_tokens=prompt,
        completion_tokens=output,
        cached_tokens=cached,
        ttft_s=ttft_s if streamed else None,  # a non-streamed body arrives whole: no TTFT
        duration_s=ttft_s + 0.01 * output,
    )
    scorer.post_response(req, info)


def scores(scorer: RelativeTtftScorer, endpoints: list[Endpoint]) -> dict[str, float]:
    return by_key(scorer.score(request(), endpoints, CycleState()))


def test_size_classes() -> None:
    assert [size_class(n) for n in (0, 127, 128, 600, 2047, 5000, 9000)] == [0, 0, 1, 2, 2, 3, 4]


def test_a_slow_server_scores_in_proportion_and_fast_ones_all_score_one() -> None:
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2, 3, 4)]
    answer_rounds(scorer, eps, (0.10, 0.11, 0.105, 0.30), 10)
    s = scores(scorer, eps)
    assert s["192.168.1.1:8000"] == s["192.168.1.2:8000"] == s["192.168.1.3:8000"] == 1.0
    assert 0.35 < s["192.168.1.4:8000"] < 0.55  # ~3x slower than the pool's median, 1.25x tolerated


def test_slowness_factors_are_the_inverse_of_the_scores() -> None:
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2, 3, 4)]
    assert scorer.slowness_factors(eps) == [1.0] * 4  # no samples yet
    answer_rounds(scorer, eps, (0.10, 0.11, 0.105, 0.30), 10)
    s = scores(scorer, eps)
    factors = dict(zip((e.key for e in eps), scorer.slowness_factors(eps), strict=True))
    assert factors["192.168.1.1:8000"] == factors["192.168.1.2:8000"] == factors["192.168.1.3:8000"] == 1.0
    assert factors["192.168.1.4:8000"] == pytest.approx(1.0 / s["192.168.1.4:8000"])
    assert factors["192.168.1.4:8000"] > 1.8


def test_two_servers_compare_against_the_faster() -> None:
    # In a pool of two the reference is the faster (the upper median would be the slow one itself).
    scorer, _ = make()
    fast, slow = endpoint(1), endpoint(2)
    for _ in range(8):
        respond(scorer, fast, 0.1)
        respond(scorer, slow, 0.25)
    s = scores(scorer, [fast, slow])
    assert s[fast.key] == 1.0
    assert 0.4 < s[slow.key] < 0.6


def test_different_prompt_sizes_are_compared_within_their_class() -> None:
    # Server 2 only gets long prompts, which take longer everywhere: it is not slow for that.
    scorer, _ = make()
    a, b, c = endpoint(1), endpoint(2), endpoint(3)
    for _ in range(10):
        respond(scorer, a, 0.10, prompt=300)
        respond(scorer, c, 0.10, prompt=300)
        respond(scorer, a, 0.50, prompt=4000)
        respond(scorer, b, 0.50, prompt=4000)
    assert set(scores(scorer, [a, b, c]).values()) == {1.0}


def test_in_a_larger_pool_a_server_is_slow_only_when_most_are_faster() -> None:
    # Four servers, two of them 1.5x slower: half the pool is not "most", so nobody is marked slow ...
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2, 3, 4)]
    answer_rounds(scorer, eps, (0.10, 0.10, 0.15, 0.15), 10)
    assert set(scores(scorer, eps).values()) == {1.0}
    # ... while one 1.5x slower server of three is.
    assert scores(scorer, eps[1:])[eps[3].key] == 1.0
    assert scores(scorer, [eps[0], eps[1], eps[3]])[eps[3].key] < 1.0


def test_jitter_within_the_tolerance_changes_nothing() -> None:
    scorer, _ = make(tolerance=0.25)
    eps = [endpoint(i) for i in (1, 2, 3)]
    answer_rounds(scorer, eps, (0.10, 0.115, 0.12), 10)
    assert set(scores(scorer, eps).values()) == {1.0}


def test_a_lora_load_is_no_sample() -> None:
    scorer, _ = make()
    a, b = endpoint(1, loras=("x",)), endpoint(2, loras=("x",))
    for _ in range(8):
        respond(scorer, a, 0.1, lora="x")
        respond(scorer, b, 0.1, lora="x")
        respond(scorer, b, 2.0, lora="y")  # "y" is not loaded on b: the wait is the adapter's load
    assert set(scores(scorer, [a, b]).values()) == {1.0}


def test_a_server_not_heard_from_fades_back_and_departed_endpoints_are_dropped() -> None:
    scorer, clock = make(memory_seconds=30.0)
    fast, slow = endpoint(1), endpoint(2)
    for _ in range(8):
        respond(scorer, fast, 0.1)
        respond(scorer, slow, 0.4)
    shunned = scorer.slowness(slow.key)
    assert shunned is not None
    assert shunned > 2.0
    assert scores(scorer, [fast, slow])[slow.key] < 0.6
    clock.advance(30.0)
    assert scorer.slowness(slow.key) == shunned  # within memorySeconds: as it was
    clock.advance(15.0)  # half the memory past it: half the excess left
    assert scorer.slowness(slow.key) == pytest.approx(1.0 + (shunned - 1.0) / 2)
    quick = scorer.slowness(fast.key)
    assert quick is not None
    assert quick < 1.0  # faster than the pool: toward 1 as well
    clock.advance(120.0)
    assert scores(scorer, [fast, slow])[slow.key] == 1.0  # tried again, not shunned for ever
    # The next sample after the silence starts a new window: the old ones say little of the server now.
    respond(scorer, slow, 0.1)
    fresh = scorer.slowness(slow.key)
    assert fresh is not None
    assert fresh < 1.0
    scorer.endpoints_changed(frozenset({fast.key}))
    assert scorer.slowness(slow.key) is None


def test_without_samples_everyone_scores_one() -> None:
    scorer, _ = make()
    a, b = endpoint(1), endpoint(2)
    assert set(scores(scorer, [a, b]).values()) == {1.0}
    for _ in range(5):
        respond(scorer, a, 0.5)  # as fast as itself: the pool's norm
    assert set(scores(scorer, [a, b]).values()) == {1.0}


def test_a_server_that_gets_everything_is_compared_with_the_norm_when_it_slows_down() -> None:
    # Affinity sends every request to server 1; the others have no samples. When server 1 becomes 8x slower its
    # TTFT is far above the pool's reference (which has only known it fast), and the others count as typical.
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2, 3)]
    for _ in range(20):
        respond(scorer, eps[0], 0.2)
    assert set(scores(scorer, eps).values()) == {1.0}
    for _ in range(16):
        respond(scorer, eps[0], 1.6)
    s = scores(scorer, eps)
    assert s[eps[1].key] == s[eps[2].key] == 1.0
    assert s[eps[0].key] < 0.7


def test_non_streamed_responses_compare_their_durations_for_the_same_output_length() -> None:
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2, 3)]
    for _ in range(10):
        for e, ttft in zip(eps, (0.1, 0.1, 0.8), strict=True):
            respond(scorer, e, ttft, streamed=False, output=8)
            respond(scorer, e, 0.1 if e is not eps[2] else 0.8, streamed=False, output=1000)
    s = scores(scorer, eps)
    assert s[eps[0].key] == s[eps[1].key] == 1.0
    assert s[eps[2].key] < 0.5
    # Long answers take longer everywhere: a server that only gets those is not slow for it.
    scorer, _ = make()
    for _ in range(10):
        respond(scorer, eps[0], 0.1, streamed=False, output=8)
        respond(scorer, eps[1], 0.1, streamed=False, output=1000)
        respond(scorer, eps[2], 0.1, streamed=False, output=8)
        respond(scorer, eps[2], 0.1, streamed=False, output=1000)
    assert set(scores(scorer, eps).values()) == {1.0}


def test_a_late_first_token_counts_at_once_and_an_ordinary_one_when_its_response_ends() -> None:
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2, 3)]
    for _ in range(6):
        for e in eps:
            respond(scorer, e, 0.10)
    slow = eps[2]
    # 1.5x the pool's TTFT (as queueing makes it): nothing until the response ends, whose sample is that TTFT.
    ordinary = [pick(scorer, slow) for _ in range(10)]
    for req in ordinary:
        scorer.first_token(req, ResponseInfo(slow.key, ttft_s=0.15))
    assert scorer.slowness(slow.key) == pytest.approx(1.0, abs=0.05)
    for req in ordinary:
        complete(scorer, req, slow, 0.15)
    assert 1.25 < scorer.slowness(slow.key) <= 1.5  # (the pool's reference moves up a little with them)
    # 30x: each first token is a sample when it arrives, hours before a slow answer of 512 tokens would end;
    # the end of those responses adds nothing more.
    late = [pick(scorer, slow) for _ in range(12)]
    for req in late:
        scorer.first_token(req, ResponseInfo(slow.key, ttft_s=3.0))
    assert scorer.slowness(slow.key) > 15.0
    assert scores(scorer, eps)[slow.key] < 0.1
    window = list(scorer._samples[slow.key].ratios)
    for req in late:
        complete(scorer, req, slow, 3.0)
    assert list(scorer._samples[slow.key].ratios) == window


def test_a_late_first_token_is_sampled_again_when_the_usage_shows_another_size_class() -> None:
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2, 3)]
    for _ in range(6):
        for e in eps:
            respond(scorer, e, 0.04, prompt=100)  # class 0
            respond(scorer, e, 0.40, prompt=3000)  # class 3
    target = eps[0]
    # picker expected a cached prefix (100 tokens to prefill); the server had evicted it and prefilled 3,000.
    req = pick(scorer, target, prompt=100)
    before = len(scorer._samples[target.key].ratios)
    scorer.first_token(req, ResponseInfo(target.key, ttft_s=0.40))
    assert scorer.slowness(target.key) == pytest.approx(1.0)  # one ratio of 10 among ten of 1: not the median
    assert max(scorer._samples[target.key].ratios) == pytest.approx(10.0)
    complete(scorer, req, target, 0.40, prompt=3000)
    assert max(scorer._samples[target.key].ratios) == pytest.approx(1.0)  # as fast as the pool for 3,000 tokens
    assert len(scorer._samples[target.key].ratios) == before + 1  # replaced, not added twice


def test_samples_older_than_the_memory_leave_the_window_of_a_server_still_heard_from() -> None:
    scorer, clock = make(memorySeconds=30)
    eps = [endpoint(i) for i in (1, 2, 3)]
    answer_rounds(scorer, eps, (0.10, 0.10, 0.40), 16)
    assert scores(scorer, eps)[eps[2].key] < 0.5
    # Shunned, it gets a request every 5 s; it has recovered. Its sixteen slow samples age out over 30 s, and
    # the six fast answers of those 30 s are its slowness then (with the last 16 alone, ten would still be slow).
    for _ in range(7):
        clock.advance(5.0)
        respond(scorer, eps[2], 0.10)
        respond(scorer, eps[0], 0.10)
    assert scorer.slowness(eps[2].key) <= 1.0  # (the pool's reference rose a little with its slow answers)
    assert scores(scorer, eps)[eps[2].key] == 1.0


def test_picks_overdue_for_their_first_token_count_while_they_wait() -> None:
    scorer, clock = make(memorySeconds=30)
    eps = [endpoint(i) for i in (1, 2, 3)]
    answer_rounds(scorer, eps, (0.10, 0.10, 0.10), 6)
    stalled = eps[2]
    waiting = [pick(scorer, stalled) for _ in range(8)]
    whole = [pick(scorer, stalled, stream=False) for _ in range(8)]  # a whole body: no first token to wait for
    clock.advance(0.15)  # 1.5x the pool's TTFT, as queueing makes it: nothing yet
    assert scorer.slowness(stalled.key) == pytest.approx(1.0)
    clock.advance(0.85)  # 10x: eight waits above the six samples of 1 (the median of fourteen)
    assert scorer.slowness(stalled.key) == pytest.approx(10.0, rel=0.05)
    assert scores(scorer, eps)[stalled.key] < 0.15
    clock.advance(1.0)  # still waiting: the bound grows with the wait
    assert scorer.slowness(stalled.key) == pytest.approx(20.0, rel=0.05)
    for req in waiting[:5]:  # five first tokens come late and are sampled at once; three picks still wait
        scorer.first_token(req, ResponseInfo(stalled.key, ttft_s=2.0))
    assert (scorer.slowness(stalled.key) or 0.0) > 12.0  # (the late samples raised the pool's reference a little)
    for req in waiting[5:]:
        scorer.first_token(req, ResponseInfo(stalled.key, ttft_s=2.0))
    assert not scorer._samples[stalled.key].waiting  # arrived: sampled, no longer waiting
    assert whole  # never counted: the slowness above is the streamed picks' alone

    # Picks whose responses never report (lost on the way) stop counting after memorySeconds.
    lost = endpoint(4)
    eps.append(lost)
    answer_rounds(scorer, eps, (0.10, 0.10, 0.10, 0.10), 8)
    for _ in range(9):
        pick(scorer, lost)
    clock.advance(5.0)
    assert scorer.slowness(lost.key) > 10.0  # nine waits above eight samples
    clock.advance(30.0)
    assert scorer.slowness(lost.key) < 1.0  # its own samples again (faster than the risen reference)
    assert not scorer._samples[lost.key].waiting


def test_a_pick_served_by_a_fallback_no_longer_waits_on_its_first_target() -> None:
    scorer, clock = make()
    eps = [endpoint(i) for i in (1, 2, 3)]
    answer_rounds(scorer, eps, (0.10, 0.10, 0.10), 8)
    req = pick(scorer, eps[0])
    clock.advance(0.05)
    complete(scorer, req, eps[1], 0.10)  # the gateway retried it on eps[1], which answered
    clock.advance(5.0)
    assert not scorer._samples[eps[0].key].waiting
    assert scorer.slowness(eps[0].key) == pytest.approx(1.0, abs=0.1)
    scorer.endpoints_changed(frozenset(e.key for e in eps[1:]))  # a departed endpoint's picks go with it
    pick(scorer, eps[1])
    scorer.endpoints_changed(frozenset(e.key for e in eps[2:]))
    assert not scorer._waiting_on


def test_picks_never_answered_are_forgotten_past_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relative_ttft, "_MAX_PENDING", 4)
    scorer, _ = make()
    eps = [endpoint(i) for i in (1, 2)]
    picks = [pick(scorer, eps[i % 2]) for i in range(6)]  # no response ever reports (a client that sent no body)
    assert list(scorer._waiting_on) == [r.request_id for r in picks[2:]]
    assert sum(len(scorer._samples[e.key].waiting) for e in eps) == 4
