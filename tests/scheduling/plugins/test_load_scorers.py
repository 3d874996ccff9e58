"""token-load-scorer, load-aware-scorer, active-request-scorer: the reference formulas and their edges."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from picker.plugins import Category, CycleState, PluginContext
from picker.scheduling.framework import ROTATE_TIES
from picker.scheduling.plugins import active_request, load_aware, token_load
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from tests.conftest import endpoint, request
from tests.scheduling.helpers import FixedSpeeds, by_key, ctx

E1, E2, E3 = endpoint(1), endpoint(2), endpoint(3)


# -- token-load-scorer ----------------------------------------------------------------------------------------


def test_token_load_is_one_minus_inflight_over_threshold() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 100, 0.0)
    c.inflight.acquire(E2.key, 1000, 0.0)
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000), c)
    req = request(prompt="", prompt_tokens=0)
    assert by_key(scorer.score(req, [E1, E2, E3], CycleState())) == {E1.key: 0.9, E2.key: 0.0, E3.key: 1.0}
    assert scorer.category is Category.DISTRIBUTION


def test_token_load_caps_at_the_threshold_and_counts_this_request() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 5000, 0.0)
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000), c)
    scores = by_key(scorer.score(request(prompt_tokens=100), [E1, E2], CycleState()))
    assert scores == {E1.key: 0.0, E2.key: 0.9}  # E2: only this request's 100 tokens


def test_token_load_counts_only_uncached_prompt_tokens_where_a_prefix_matched() -> None:
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000), ctx())
    cycle = CycleState()
    cycle[MATCH_STATE] = PrefixMatch({E1.key: 3}, 4, 64, 256, 64.0)  # E1 holds 3/4 of the prompt
    scores = by_key(scorer.score(request(prompt_tokens=400), [E1, E2], cycle))
    assert scores == {E1.key: 0.9, E2.key: 0.6}


def test_token_load_adds_the_pending_prefill_weight_once_per_server_until_its_first_token() -> None:
    c = ctx()
    first = c.inflight.acquire(E1.key, 10, 0.0)
    c.inflight.acquire(E1.key, 10, 0.0)  # two waiting on E1: still one step to wait for
    done = c.inflight.acquire(E2.key, 10, 0.0)
    c.inflight.prefilled(done, 5)  # E2's request has its first token: 5 tokens of answer left
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000, prefillPendingTokens=300), c)
    req = request(prompt="", prompt_tokens=0)
    assert by_key(scorer.score(req, [E1, E2, E3], CycleState())) == pytest.approx(
        {E1.key: 1 - 320 / 1000, E2.key: 1 - 5 / 1000, E3.key: 1.0}
    )
    c.inflight.prefilled(first, 5)
    c.inflight.release(first)
    assert c.inflight.prefilling_of([E1, E2]) == [1, 0]
    plain = token_load.create("t", token_load.Params(queueThresholdTokens=1000), c)  # off by default
    assert by_key(plain.score(req, [E1], CycleState())) == pytest.approx({E1.key: 1 - 10 / 1000})


def test_the_pending_prefill_mark_is_for_prompts_shorter_than_it() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 10, 0.0)
    scorer = token_load.create("t", token_load.Params(queueThresholdTokens=1000, prefillPendingTokens=300), c)
    short, long = request(prompt_tokens=299), request(prompt_tokens=300)
    assert by_key(scorer.score(short, [E1], CycleState())) == pytest.approx({E1.key: 1 - 609 / 1000})
    assert by_key(scorer.score(long, [E1], CycleState())) == pytest.approx({E1.key: 1 - 310 / 1000})


def test_the_pending_prefill_mark_counts_in_each_servers_time() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 10, 0.0)  # E1: a prefill pending, as fast as the pool
    c.inflight.acquire(E2.key, 10, 0.0)  # E2: a prefill pending, 2x slower
    params = token_load.Params(queueThresholdTokens=1000, prefillPendingTokens=300, prefillPendingSpeedFrom="ttft")
    scorer = token_load.create("t", params, c)
    assert isinstance(scorer, token_load.TokenLoadScorer)
    scorer.bind({"ttft": FixedSpeeds({E2.key: 2.0, E3.key: 1.5})}, ())
    req = request(prompt="", prompt_tokens=0)
    # E3 (1.5x slower) has nothing pending but its own next prefill step takes half a step longer than E1's.
    assert by_key(scorer.score(req, [E1, E2, E3], CycleState())) == pytest.approx(
        {E1.key: 1 - 310 / 1000, E2.key: 1 - 610 / 1000, E3.key: 1 - 150 / 1000}
    )
    with pytest.raises(ValueError, match="which does not rate the servers' speed"):
        scorer.bind({"ttft": object()}, ())
    with pytest.raises(ValueError, match="prefillPendingSpeedFrom names plugin 'ttft', which is not declared"):
        scorer.bind({}, ())


def _short_scorer(c: PluginContext, *, warm: bool = True) -> token_load.TokenLoadScorer:
    params = token_load.Params(queueThresholdTokens=1000, prefillPendingTokens=300, shortPromptTokens=32)
    scorer = token_load.create("t", params, c)
    assert isinstance(scorer, token_load.TokenLoadScorer)
    for _ in range(40 if warm else 0):  # the recent prompts: short ones
        scorer.score(request(prompt_tokens=13, stream=True), [], CycleState())
    return scorer


def test_a_short_prompt_counts_the_queue_others_left_not_the_answers_being_decoded() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 10, 0.0)  # E1: a prefill of picker's pending (the rotation spaces those)
    decoding = c.inflight.acquire(E2.key, 900, 0.0)
    c.inflight.prefilled(decoding, 0)  # E2: 900 tokens of answer to decode, no prefill pending
    e3 = endpoint(3, waiting=3, running=1, own_requests=0)  # E3: 3 of another client's requests waiting
    e4 = endpoint(4, waiting=2, running=0, updated_at=0.0)  # never scraped: nothing known beyond the ledger
    scorer = _short_scorer(c)
    cycle = CycleState()
    scores = by_key(scorer.score(request(prompt_tokens=13, stream=True), [E1, E2, e3, e4], cycle))
    assert scores == pytest.approx({E1.key: 1.0, E2.key: 1.0, e3.key: 1 - 900 / 1000, e4.key: 1.0})
    assert cycle[ROTATE_TIES] is True
    # A prompt of 32 tokens is not short: the answers in flight count, and the picker is not asked to rotate.
    cycle = CycleState()
    scores = by_key(scorer.score(request(prompt_tokens=32, stream=True), [E1, E2, e3], cycle))
    assert scores == pytest.approx({E1.key: 1 - 342 / 1000, E2.key: 1 - 932 / 1000, e3.key: 1 - 32 / 1000})
    assert ROTATE_TIES not in cycle


def test_short_prompts_count_only_their_queue_while_most_recent_prompts_are_short() -> None:
    c = ctx()
    c.inflight.acquire(E1.key, 500, 0.0)
    scorer = _short_scorer(c, warm=False)
    short, long = request(prompt_tokens=13, stream=True), request(prompt_tokens=400, stream=True)
    decode_counted = {E1.key: pytest.approx(1 - 813 / 1000)}  # 500 in flight + 13 + the pending mark
    assert by_key(scorer.score(short, [E1], CycleState())) == decode_counted  # the share starts at 0
    for _ in range(40):
        scorer.score(short, [E1], CycleState())
    cycle = CycleState()
    assert by_key(scorer.score(short, [E1], cycle)) == {E1.key: 1.0}  # nothing queued beyond picker's own
    assert cycle[ROTATE_TIES] is True
    for _ in range(40):  # long prompts come to outnumber the short ones
        scorer.score(long, [E1], CycleState())
    cycle = CycleState()
    assert by_key(scorer.score(short, [E1], cycle)) == decode_counted
    assert ROTATE_TIES not in cycle


def test_a_short_prompt_leaves_picker_s_own_pending_prefills_to_the_rotation() -> None:
    # Independent replicas (or one picker) each send short prompts in turn; a server whose turn has come with a
    # short prefill of picker's still pending is not skipped, since skipping puts the prompt out of turn onto a
    # server another replica may have just sent one to. A slow server's own next step still counts.
    c = ctx()
    for e in (E1, E2):
        c.inflight.acquire(e.key, 13, 0.0)
    params = token_load.Params(
        queueThresholdTokens=1000, prefillPendingTokens=300, shortPromptTokens=32, prefillPendingSpeedFrom="ttft"
    )
    scorer = token_load.create("t", params, c)
    assert isinstance(scorer, token_load.TokenLoadScorer)
    scorer.bind({"ttft": FixedSpeeds({E2.key: 2.0, E3.key: 1.5})}, ())
    for _ in range(40):
        scorer.score(request(prompt_tokens=13, stream=True), [], CycleState())
    e4 = endpoint(4)
    cycle = CycleState()
    scores = by_key(scorer.score(request(prompt_tokens=13, stream=True), [E1, E2, E3, e4], cycle))
    assert scores == pytest.approx({E1.key: 1.0, E2.key: 1 - 300 / 1000, E3.key: 1 - 150 / 1000, e4.key: 1.0})
    assert cycle[ROTATE_TIES] is True
    # A longer prompt (the usual path) still counts the pending mark, in each server's time.
    scores = by_key(scorer.score(request(prompt_tokens=100, stream=True), [E1, E2, E3], CycleState()))
    assert scores == pytest.approx({E1.key: 1 - 413 / 1000, E2.key: 1 - 713 / 1000, E3.key: 1 - 250 / 1000})


def test_a_short_prompt_counts_a_backlog_of_picker_s_own_prefills() -> None:
    # A server that stopped producing first tokens (hung, its /metrics still answering) keeps picker's prompts
    # pending while the others answer theirs: beyond twice the mean plus one, each pending prefill counts a mark.
    c = ctx()
    e4 = endpoint(4)
    for _ in range(4):
        c.inflight.acquire(E1.key, 13, 0.0)
    c.inflight.acquire(E2.key, 13, 0.0)
    scorer = _short_scorer(c)
    scores = by_key(scorer.score(request(prompt_tokens=13, stream=True), [E1, E2, E3, e4], CycleState()))
    # mean 5 / 4 = 1.25, limit 3.5: E1's 4 pending count half a mark; E2's one is its turn.
    assert scores == pytest.approx({E1.key: 1 - 150 / 1000, E2.key: 1.0, E3.key: 1.0, e4.key: 1.0})
    for e in (E2, E3, e4):  # every server busy alike (one picker at a high rate): no backlog anywhere
        for _ in range(3):
            c.inflight.acquire(e.key, 13, 0.0)
    scores = by_key(scorer.score(request(prompt_tokens=13, stream=True), [E1, E2, E3, e4], CycleState()))
    assert scores == pytest.approx({E1.key: 1.0, E2.key: 1.0, E3.key: 1.0, e4.key: 1.0})


def test_a_short_prompt_not_streamed_counts_the_answers_in_flight() -> None:
    c = ctx()
    stuck = c.inflight.acquire(E1.key, 900, 0.0)  # E1: a request lingering (a stalled server, say)
    c.inflight.prefilled(stuck, 0)
    scorer = _short_scorer(c)  # the recent requests: short and streamed
    for _ in range(40):  # a client that does not stream: the whole answer is what it waits for
        scorer.score(request(prompt_tokens=13), [E1], CycleState())
    cycle = CycleState()
    assert by_key(scorer.score(request(prompt_tokens=13), [E1, E2], cycle)) == pytest.approx(
        {E1.key: 1 - 913 / 1000, E2.key: 1 - 13 / 1000}
    )
    assert ROTATE_TIES not in cycle


def test_short_prompts_need_a_pending_mark_at_least_as_long() -> None:
    assert token_load.Params().short_prompt_tokens == 0  # off by default
    with pytest.raises(ValidationError, match="set prefillPendingTokens to at least 32"):
        token_load.Params(shortPromptTokens=32)
    with pytest.raises(ValidationError, match="at least 64"):
        token_load.Params(shortPromptTokens=64, prefillPendingTokens=63)


def test_token_load_default_threshold_and_validation() -> None:
    assert token_load.Params().queue_threshold_tokens == 4_194_304
    with pytest.raises(ValidationError):
        token_load.Params(queueThresholdTokens=0)
    assert token_load.Params.model_validate({"inFlightLoadProducerName": "x"}).in_flight_load_producer_name == "x"


# -- load-aware-scorer ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("waiting", "expected"),
    [(0, 0.5), (1, 0.5 * (1 - 1 / 128)), (64, 0.25), (128, 0.0), (500, 0.0)],
)
def test_load_aware_half_scale(waiting: int, expected: float) -> None:
    scorer = load_aware.create("l", load_aware.Params(), ctx())
    assert by_key(scorer.score(request(), [endpoint(1, waiting=waiting)], CycleState())) == {
        E1.key: pytest.approx(expected)
    }


def test_load_aware_threshold_parameter() -> None:
    scorer = load_aware.create("l", load_aware.Params(threshold=4), ctx())
    assert by_key(scorer.score(request(), [endpoint(1, waiting=2)], CycleState())) == {E1.key: 0.25}
    with pytest.raises(ValidationError):
        load_aware.Params(threshold=0)


# -- active-request-scorer -------------------------------------------------------------------------------------


def test_active_request_relative_to_the_busiest() -> None:
    c = ctx()
    for _ in range(4):
        c.inflight.acquire(E1.key, 1, 0.0)
    c.inflight.acquire(E2.key, 1, 0.0)
    scorer = active_request.create("a", active_request.Params(), c)
    assert by_key(scorer.score(request(), [E1, E2, E3], CycleState())) == {E1.key: 0.0, E2.key: 0.75, E3.key: 1.0}


def test_active_request_idle_threshold_and_max_busy_score() -> None:
    c = ctx()
    for _ in range(4):
        c.inflight.acquire(E1.key, 1, 0.0)
    for _ in range(2):
        c.inflight.acquire(E2.key, 1, 0.0)
    c.inflight.acquire(E3.key, 1, 0.0)
    scorer = active_request.create("a", active_request.Params(idleThreshold=1, maxBusyScore=0.5), c)
    # E3 (1 ≤ idle threshold) is idle; busy ones scale into [0, 0.5].
    assert by_key(scorer.score(request(), [E1, E2, E3], CycleState())) == {E1.key: 0.0, E2.key: 0.25, E3.key: 1.0}


def test_active_request_all_idle_and_released_leases() -> None:
    c = ctx()
    lease = c.inflight.acquire(E1.key, 1, 0.0)
    c.inflight.release(lease)
    scorer = active_request.create("a", active_request.Params(), c)
    assert set(by_key(scorer.score(request(), [E1, E2], CycleState())).values()) == {1.0}


def test_active_request_parameter_bounds() -> None:
    with pytest.raises(ValidationError):
        active_request.Params(maxBusyScore=1.5)
    with pytest.raises(ValidationError):
        active_request.Params(idleThreshold=-1)
    assert active_request.Params.model_validate({"requestTimeout": "2m"}).request_timeout == "2m"
