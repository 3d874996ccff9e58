"""prefix-cache-scorer's picker options (scoreMode tokens, charsPerToken, hot-prefix cap, cold spreading), the
match it leaves in the cycle, and the lmetric-scorer built on its index."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from picker.bench.policies import V2_CONFIG_TEXT
from picker.endpoints.model import Endpoint
from picker.plugins import Category, CycleState, PluginContext, ProfileResult, ResponseInfo, SchedulingResult
from picker.request.model import InferenceRequest
from picker.scheduling import speed
from picker.scheduling.config import load_config
from picker.scheduling.plugins import lmetric, prefix
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch, match_key
from tests.conftest import endpoint, request
from tests.scheduling.helpers import FixedSpeeds, by_key, ctx

BLOCK = 64
EPS = [endpoint(1), endpoint(2), endpoint(3)]
E1, E2, E3 = (e.key for e in EPS)


def _scorer(c: object = None, **params: object) -> prefix.PrefixCacheScorer:
    scorer = prefix.create("prefix", prefix.Params.model_validate(params), c or ctx())  # type: ignore[arg-type]
    assert isinstance(scorer, prefix.PrefixCacheScorer)
    return scorer


def _learn(scorer: prefix.PrefixCacheScorer, req: InferenceRequest, target: Endpoint) -> None:
    results: dict[str, ProfileResult | None] = {"default": ProfileResult((target,))}
    scorer.pre_request(req, SchedulingResult((target,), "default", (), results))


def test_defaults_keep_the_reference_behaviour() -> None:
    params = prefix.Params()
    assert (params.score_mode, params.max_load_factor, params.cold_spread, params.chars_per_token) == (
        "ratio", 0.0, 0.0, 4.0
    )  # fmt: skip


def test_tokens_mode_scores_absolute_matched_tokens() -> None:
    ratio, tokens = _scorer(), _scorer(scoreMode="tokens", saturationTokens=96)
    shared = "s" * (BLOCK * 3)
    req = request(prompt=shared + "n" * BLOCK)  # 256 chars ⇒ 64 tokens; 3 of 4 blocks held by E2
    for scorer in (ratio, tokens):
        _learn(scorer, request(prompt=shared), EPS[1])
    assert by_key(ratio.score(req, EPS, CycleState()))[E2] == 0.75
    assert by_key(tokens.score(req, EPS, CycleState()))[E2] == 0.5  # 48 matched tokens / 96


def test_tokens_mode_does_not_overrate_a_short_whole_match() -> None:
    ratio, tokens = _scorer(), _scorer(scoreMode="tokens")
    short = request(prompt="s" * BLOCK)  # 16 tokens, all of it cached on E1
    for scorer in (ratio, tokens):
        _learn(scorer, short, EPS[0])
    assert by_key(ratio.score(short, EPS, CycleState()))[E1] == 1.0
    assert by_key(tokens.score(short, EPS, CycleState()))[E1] == pytest.approx(16 / 2048)


def test_tokens_mode_calibrates_characters_per_token_from_usage() -> None:
    scorer = _scorer(scoreMode="tokens", saturationTokens=48)
    shared = "s" * (BLOCK * 3)
    req = request(prompt=shared + "n" * BLOCK)
    _learn(scorer, request(prompt=shared), EPS[1])
    scorer.post_response(req, ResponseInfo(endpoint_key=E2, prompt_tokens=32))  # 256 chars / 32 tokens = 8
    assert scorer.tokens.chars_per_token(req.target_model) == 8.0
    assert by_key(scorer.score(req, EPS, CycleState()))[E2] == 0.5  # 24 of 32 tokens matched / 48


def test_ratio_mode_does_not_calibrate() -> None:
    scorer = _scorer()
    scorer.post_response(request(prompt="x" * 100), ResponseInfo(endpoint_key=E1, prompt_tokens=10))
    assert scorer.tokens.chars_per_token("my-model") == 4.0


def test_chars_per_token_sets_the_block_size() -> None:
    scorer = _scorer(charsPerToken=2.0, autoTune=False)  # 16 tokens x 2 = 32-character blocks
    _learn(scorer, request(prompt="k" * 64), EPS[0])
    assert scorer.index.endpoint_blocks(E1) == 2


def test_match_state_is_left_in_the_cycle() -> None:
    scorer = _scorer()
    req = request(prompt="s" * (BLOCK * 2))
    _learn(scorer, req, EPS[2])
    cycle = CycleState()
    scorer.score(req, EPS, cycle)
    match = cycle[match_key("prefix")]
    assert cycle[MATCH_STATE] is match
    assert isinstance(match, PrefixMatch)
    assert (match.blocks, match.total_blocks, match.block_chars, match.prompt_chars) == ({E3: 2}, 2, BLOCK, 128)
    assert not match.cold
    assert match.matched_fraction(E3) == 1.0
    assert match.uncached_tokens(E1) == match.prompt_tokens == 32


def test_hot_prefix_cap_sends_the_request_elsewhere() -> None:
    c = ctx()
    scorer = _scorer(c, maxLoadFactor=1.25)
    req = request(prompt="s" * 300)
    _learn(scorer, req, EPS[1])
    assert by_key(scorer.score(req, EPS, CycleState()))[E2] == 1.0  # idle: E2 may take one more
    for _ in range(2):
        c.inflight.acquire(E2, 1, 0.0)
    # Σn + 1 = 3 over 3 endpoints: cap ceil(1.25) = 2; E2 would have 3 ⇒ hot.
    assert by_key(scorer.score(req, EPS, CycleState())) == {E1: 0.0, E2: 0.0, E3: 0.0}
    c.inflight.acquire(E1, 1, 0.0)
    c.inflight.acquire(E3, 1, 0.0)
    # Σn + 1 = 5: cap ceil(2.08) = 3; E2 would have 3 ⇒ fine again.
    assert by_key(scorer.score(req, EPS, CycleState()))[E2] == 1.0


def test_load_cap_floor_keeps_affinity_at_low_load() -> None:
    c = ctx()
    scorer = _scorer(c, maxLoadFactor=1.25, loadCapFloor=4)
    req = request(prompt="s" * 300)
    _learn(scorer, req, EPS[1])
    for _ in range(3):
        c.inflight.acquire(E2, 1, 0.0)
    assert by_key(scorer.score(req, EPS, CycleState()))[E2] == 1.0
    c.inflight.acquire(E2, 1, 0.0)
    assert by_key(scorer.score(req, EPS, CycleState()))[E2] == 0.0


def test_max_load_factor_is_off_or_at_least_one() -> None:
    with pytest.raises(ValidationError):
        prefix.Params(maxLoadFactor=0.5)
    with pytest.raises(ValidationError):
        prefix.Params(coldSpread=1.5)


def test_cold_spread_prefers_the_endpoint_with_the_least_cached() -> None:
    scorer = _scorer(coldSpread=0.5)
    _learn(scorer, request(prompt="a" * (BLOCK * 4)), EPS[0])
    _learn(scorer, request(prompt="b" * (BLOCK * 2)), EPS[1])
    cold = request(prompt="c" * (BLOCK * 2))
    assert by_key(scorer.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.25, E3: 0.5}
    fresh = _scorer(coldSpread=0.5)
    assert set(by_key(fresh.score(cold, EPS, CycleState())).values()) == {0.5}
    assert set(by_key(fresh.score(request(prompt="hi"), EPS, CycleState())).values()) == {0.0}  # < one block


def _spreading(**params: object) -> prefix.PrefixCacheScorer:
    """A cold-spreading scorer, told E1 answers 2x slower than the pool, after every server took one prompt."""
    scorer = _scorer(coldSpread=1.0, **params)
    scorer.bind({"ttft": FixedSpeeds({E1: 2.0})}, ())
    for target in EPS:  # every server holds the same: the spread alone would treat them alike
        _learn(scorer, request(prompt=f"{target.key}" + "x" * BLOCK), target)
    return scorer


def test_cold_spread_of_short_prompts_weighs_each_server_by_its_speed() -> None:
    scorer = _spreading(coldSpreadSpeedFrom="ttft")
    short = request(prompt="c" * 100)  # 25 tokens: under the 32 of coldSpreadSpeedMaxTokens
    # E1 answers 2x slower than the pool: its content counts double, so the others are half as full as it.
    assert by_key(scorer.score(short, EPS, CycleState())) == {E1: 0.0, E2: 0.5, E3: 0.5}
    long = request(prompt="c" * (BLOCK * 16))  # 256 tokens: its spread places cache, by content alone
    assert set(by_key(scorer.score(long, EPS, CycleState())).values()) == {0.0}
    tight = _spreading(coldSpreadSpeedFrom="ttft", coldSpreadSpeedMaxTokens=25)
    assert set(by_key(tight.score(short, EPS, CycleState())).values()) == {0.0}
    plain = _spreading()  # no speed source named: bind leaves the spread as it was
    assert set(by_key(plain.score(short, EPS, CycleState())).values()) == {0.0}


def test_cold_spread_lora_fit_keeps_an_adapter_off_servers_it_would_wait_on() -> None:
    # One adapter slot each: E1 runs lora-a, E2 runs lora-b, E3 runs nothing; E1 took the most content.
    pool = [
        endpoint(1, loras=("lora-a",), max_loras=1),
        endpoint(2, loras=("lora-b",), max_loras=1),
        endpoint(3, max_loras=1),
    ]
    cold_a = request(model="lora-a", prompt="c" * (BLOCK * 2))
    on, off = _scorer(coldSpread=1.0, coldSpreadLoraFit=True), _scorer(coldSpread=1.0)
    for scorer in (on, off):
        _learn(scorer, request(prompt="a" * (BLOCK * 4)), pool[0])
    # The spread alone favours E2 (empty) as much as E3, but lora-a would wait there for lora-b to drain.
    assert by_key(off.score(cold_a, pool, CycleState())) == {E1: 0.0, E2: 1.0, E3: 1.0}
    assert by_key(on.score(cold_a, pool, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}
    # An adapter only waiting to be loaded somewhere is an adapter too: it fits only where a slot is free.
    queued = [endpoint(1, waiting_loras=("lora-c",), max_loras=1), pool[1], pool[2]]
    cold_c = request(model="lora-c", prompt="c" * (BLOCK * 2))
    assert by_key(on.score(cold_c, queued, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}
    # A base-model request names no adapter any server lists: the spread is as before.
    base = request(model="my-model", prompt="c" * (BLOCK * 2))
    assert by_key(on.score(base, pool, CycleState())) == by_key(off.score(base, pool, CycleState()))
    # Where the adapter fits nowhere (every slot taken), the spread is as before too.
    full = [queued[0], pool[1], endpoint(3, loras=("lora-b",), max_loras=1)]
    assert by_key(on.score(cold_c, full, CycleState())) == by_key(off.score(cold_c, full, CycleState()))
    assert by_key(on.score(cold_c, full, CycleState())) == {E1: 0.0, E2: 1.0, E3: 1.0}
    # A prompt some server holds is scored by its match, not by the spread.
    warm = request(model="lora-a", prompt="w" * (BLOCK * 2))
    for scorer in (on, off):
        _learn(scorer, warm, pool[1])
    assert by_key(on.score(warm, pool, CycleState())) == by_key(off.score(warm, pool, CycleState()))
    assert by_key(on.score(warm, pool, CycleState()))[E2] == 1.0


def test_the_relative_ttft_scorer_is_a_speed_source_for_the_spread() -> None:
    config = load_config(V2_CONFIG_TEXT, ctx())  # picker's previous default
    scorer = config.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, prefix.PrefixCacheScorer)
    assert isinstance(config.plugins["relative-ttft-scorer"], speed.SpeedSource)
    assert scorer.params.cold_spread_speed_from == "relative-ttft-scorer"


# -- lmetric-scorer ------------------------------------------------------------------------------------------------


def _lmetric(c: object = None, **params: object) -> lmetric.LMetricScorer:
    scorer = lmetric.create("lm", lmetric.Params.model_validate(params), c or ctx())  # type: ignore[arg-type]
    assert isinstance(scorer, lmetric.LMetricScorer)
    return scorer


def test_lmetric_cost_is_uncached_tokens_times_batch_plus_one() -> None:
    c = ctx()
    scorer = _lmetric(c)
    req = request(prompt="s" * (BLOCK * 4))  # 64 tokens
    _learn(scorer, request(prompt="s" * (BLOCK * 3)), EPS[1])  # E2 holds 48 of them
    for _ in range(3):
        c.inflight.acquire(E2, 1, 0.0)
    eps = [EPS[0], EPS[1], endpoint(3, running=1, waiting=1)]
    assert scorer.costs(req, eps, CycleState()) == [64.0, 16.0 * 4, 64.0 * 3]
    assert by_key(scorer.score(req, eps, CycleState())) == {E1: pytest.approx(2 / 3), E2: pytest.approx(2 / 3), E3: 0.0}
    assert scorer.category is Category.BALANCE


def test_lmetric_full_hit_costs_at_least_one_token_and_equal_costs_score_one() -> None:
    scorer = _lmetric()
    req = request(prompt="s" * (BLOCK * 2))
    _learn(scorer, req, EPS[0])
    assert scorer.costs(req, EPS, CycleState())[0] == 1.0
    assert set(by_key(scorer.score(request(prompt="zz"), EPS, CycleState())).values()) == {1.0}


@pytest.mark.parametrize(("source", "batch"), [("inflight", 2), ("scraped", 5), ("max", 5)])
def test_lmetric_load_source(source: str, batch: int) -> None:
    c = ctx()
    for _ in range(2):
        c.inflight.acquire(E1, 1, 0.0)
    scorer = _lmetric(c, loadSource=source)
    ep = endpoint(1, running=3, waiting=2)
    assert scorer.costs(request(prompt="x" * 40), [ep], CycleState()) == [10.0 * (batch + 1)]


def test_lmetric_learns_and_calibrates_like_the_prefix_scorer() -> None:
    scorer = _lmetric()
    req = request(prompt="s" * (BLOCK * 2))
    scorer.post_response(req, ResponseInfo(endpoint_key=E1, prompt_tokens=64))  # 2 chars per token
    assert scorer.tokens.prompt_tokens(req) == 64.0
    cycle = CycleState()
    scorer.score(req, EPS, cycle)
    assert isinstance(cycle[match_key("lm")], PrefixMatch)


def test_a_match_only_on_a_non_candidate_is_cold() -> None:
    scorer = _scorer(coldSpread=0.5)
    req = request(prompt="s" * 300)
    _learn(scorer, req, EPS[2])
    cycle = CycleState()
    scores = by_key(scorer.score(req, EPS[:2], cycle))
    assert cycle[MATCH_STATE].cold
    assert scores == {E1: 0.5, E2: 0.5}


@pytest.mark.parametrize(
    ("held_by_e2", "others", "affinity"),
    [
        (4, 0, True),  # 4 ahead of the least busy: not beyond balanceAbsThreshold 4
        (5, 0, False),  # 5 ahead and beyond 1.5 x 0: the load scorers decide
        (11, 6, False),  # 5 ahead and beyond 1.5 x 6 = 9
        (20, 14, True),  # 6 ahead but within 1.5 x 14 = 21: a busy pool is not imbalanced by 6
    ],
)
def test_bounded_imbalance_drops_affinity_only_beyond_both_thresholds(
    held_by_e2: int, others: int, affinity: bool
) -> None:
    c = ctx()
    scorer = _scorer(c, balanceAbsThreshold=4, balanceRelThreshold=1.5)
    req = request(prompt="s" * 300)
    _learn(scorer, req, EPS[1])
    for key, n in ((E1, others), (E2, held_by_e2), (E3, others)):
        for _ in range(n):
            c.inflight.acquire(key, 1, 0.0)
    assert by_key(scorer.score(req, EPS, CycleState())) == {E1: 0.0, E2: 1.0 if affinity else 0.0, E3: 0.0}


def test_bounded_imbalance_also_bounds_the_cold_spread() -> None:
    c = ctx()
    scorer = _scorer(c, coldSpread=1.0, balanceAbsThreshold=2)
    for _ in range(3):
        c.inflight.acquire(E1, 1, 0.0)
    assert by_key(scorer.score(request(prompt="c" * (BLOCK * 2)), EPS, CycleState())) == {E1: 0.0, E2: 1.0, E3: 1.0}


def test_bounded_imbalance_is_off_by_default_and_validated() -> None:
    assert prefix.Params().balance_abs_threshold == 0.0
    with pytest.raises(ValidationError):
        prefix.Params(balanceRelThreshold=0.9)
    with pytest.raises(ValidationError):
        prefix.Params(balanceAbsThreshold=-1)


def test_cold_spread_placed_basis_keeps_spreading_when_every_cache_is_full() -> None:
    c = ctx()
    held = _scorer(c, coldSpread=1.0, lruCapacityPerServer=2, autoTune=False)
    placed = _scorer(c, coldSpread=1.0, lruCapacityPerServer=2, autoTune=False, coldSpreadBasis="placed")
    for scorer in (held, placed):
        for i, target in enumerate((EPS[0], EPS[0], EPS[0], EPS[1])):
            _learn(scorer, request(prompt=f"{i}" * (BLOCK * 2)), target)
    cold = request(prompt="c" * (BLOCK * 2))
    # Each LRU holds its 2 blocks: "held" sees E1 = E2, "placed" sees that E1 took 6 new blocks and E2 2.
    assert by_key(held.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}
    assert by_key(placed.score(cold, EPS, CycleState())) == {E1: 0.0, E2: round(1 - 2 / 6, 9), E3: 1.0}


def test_cold_spread_placed_counts_only_new_blocks_and_fade() -> None:
    c = ctx()
    scorer = _scorer(c, coldSpread=1.0, coldSpreadBasis="placed", placedHalfLifeS=10)
    req = request(prompt="s" * (BLOCK * 4))
    for _ in range(3):
        _learn(scorer, req, EPS[0])  # the same prompt again: nothing new after the first time
    _learn(scorer, request(prompt="t" * (BLOCK * 2)), EPS[1])
    cold = request(prompt="c" * (BLOCK * 2))
    assert by_key(scorer.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.5, E3: 1.0}
    c.clock.advance(10.0)  # type: ignore[attr-defined]
    _learn(scorer, request(prompt="u" * (BLOCK * 2)), EPS[0])  # E1: 4 / 2 + 2 = 4, E2: 2 / 2 = 1
    assert by_key(scorer.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.75, E3: 1.0}


# -- coldSpreadPlacedWhenFull --------------------------------------------------------------------------------------

QUEUED = [endpoint(1, waiting=1), endpoint(2, waiting=1), endpoint(3, waiting=1)]  # the same keys as EPS


def _filling(c: object = None, **params: object) -> prefix.PrefixCacheScorer:
    """A scorer whose index holds 2 blocks per server at most, after E1 took 6 new blocks, E2 4 and E3 none."""
    scorer = _scorer(c, coldSpread=1.0, lruCapacityPerServer=2, autoTune=False, coldSpreadPlacedWhenFull=True, **params)
    for i, target in enumerate((EPS[0], EPS[0], EPS[0], EPS[1], EPS[1])):
        _learn(scorer, request(prompt=f"{i}" * (BLOCK * 2)), target)
    return scorer


# The spread once every index is full after ``_filling`` and E3's 2 blocks (placed 6, 4, 2): 1 - placed / max.
SOFT = {E1: 0.0, E2: round(1 - 4 / 6, 9), E3: round(2 / 3, 9)}


def _come_back(scorer: prefix.PrefixCacheScorer, times: int) -> None:
    """Score a prompt that E1 holds ``times`` times: the share of prompts that hit rises."""
    again = request(prompt="2" * (BLOCK * 2))  # the last prompt E1 took: its LRU still holds it
    for _ in range(times):
        scorer.score(again, EPS, CycleState())


def test_placed_when_full_spreads_by_what_was_placed_once_every_index_is_full() -> None:
    scorer = _filling()
    cold = request(prompt="c" * (BLOCK * 2))
    # E3's index is empty: the blocks held still tell the servers apart (E1 = E2 = 2, E3 0).
    assert by_key(scorer.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}
    _learn(scorer, request(prompt="z" * (BLOCK * 2)), EPS[2])
    # Every index full: by the blocks placed (6, 4, 2), 1 - placed / max.
    assert by_key(scorer.score(cold, EPS, CycleState())) == SOFT
    without = _scorer(coldSpread=1.0, lruCapacityPerServer=2, autoTune=False)
    for i, target in enumerate((EPS[0], EPS[0], EPS[0], EPS[1], EPS[1], EPS[2])):
        _learn(without, request(prompt=f"{i}" * (BLOCK * 2)), target)
    assert set(by_key(without.score(cold, EPS, CycleState())).values()) == {0.0}  # held: all equal, no spread


def test_placed_when_full_is_sharp_only_when_every_server_queues_and_prompts_come_back() -> None:
    scorer = _filling()
    _learn(scorer, request(prompt="z" * (BLOCK * 2)), EPS[2])
    cold = request(prompt="c" * (BLOCK * 2))
    assert by_key(scorer.score(cold, QUEUED, CycleState())) == SOFT  # every prompt so far was new: not sharp
    _come_back(scorer, 40)  # now most prompts find their blocks on a server
    assert by_key(scorer.score(cold, QUEUED, CycleState())) == {E1: 0.0, E2: 0.5, E3: 1.0}  # (6 - n) / (6 - 2)
    one_idle = [*QUEUED[:2], endpoint(3)]
    assert by_key(scorer.score(cold, one_idle, CycleState())) == SOFT


def _own_queues(c: PluginContext) -> list[Endpoint]:
    """The three servers each reporting one request waiting, picker's own (its ledger holds one on each)."""
    for e in EPS:
        c.inflight.acquire(e.key, 100, c.clock())
    return [endpoint(i, waiting=1, own_requests=1) for i in (1, 2, 3)]


def _full_with_own_queues() -> tuple[prefix.PrefixCacheScorer, list[Endpoint]]:
    """Every index full (placed: E1 6 blocks, E2 4, E3 2), and the three servers as ``_own_queues`` reports them."""
    c = ctx()
    scorer = _filling(c)
    _learn(scorer, request(prompt="z" * (BLOCK * 2)), EPS[2])
    return scorer, _own_queues(c)


def test_placed_when_full_goes_round_strictly_where_picker_sent_the_work() -> None:
    scorer, own = _full_with_own_queues()
    cold = request(prompt="c" * (BLOCK * 2))
    _come_back(scorer, 40)
    # The queues are assumed others' until the reports show them picker's: min-max, as where others send work.
    assert by_key(scorer.score(cold, own, CycleState())) == {E1: 0.0, E2: 0.5, E3: 1.0}
    for _ in range(150):  # cold prompts while every queue is picker's own: the foreign share fades
        scorer.score(cold, own, CycleState())
    _come_back(scorer, 60)
    # Now the whole spread to the least placed only: new sessions go round the pool.
    assert by_key(scorer.score(cold, own, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}
    # A scrape that catches one queue empty: most recent cold prompts found every server queueing, still sharp.
    one_idle = [*own[:2], endpoint(3, own_requests=1)]
    assert by_key(scorer.score(cold, one_idle, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}
    # When no server queued at a quarter of the recent cold prompts, the spread is soft again.
    for _ in range(100):
        scorer.score(cold, one_idle, CycleState())
    _come_back(scorer, 60)
    assert by_key(scorer.score(cold, one_idle, CycleState())) == SOFT


def test_placed_when_full_counts_a_pool_two_deep_as_queued_where_picker_sent_the_work() -> None:
    scorer, own = _full_with_own_queues()
    cold = request(prompt="c" * (BLOCK * 2))
    for _ in range(150):  # picker's own queues: the foreign share fades
        scorer.score(cold, own, CycleState())
    one_idle = [*own[:2], endpoint(3, own_requests=1)]
    for _ in range(100):  # then one queue empty at every cold prompt: the share of queueing ones fades too
        scorer.score(cold, one_idle, CycleState())
    _come_back(scorer, 60)
    assert by_key(scorer.score(cold, one_idle, CycleState())) == SOFT
    # E3 drained while the others hold 5 waiting in all: under two per server, its queue may be room to spare.
    shallow = [endpoint(1, waiting=2, own_requests=2), endpoint(2, waiting=3, own_requests=3), endpoint(3)]
    assert by_key(scorer.score(cold, shallow, CycleState())) == SOFT
    # Two per server on average: the pool is past its knee, and the round goes on to the least placed alone
    # (E3, the empty queue here) rather than to whichever queue is shortest.
    deep = [endpoint(1, waiting=3, own_requests=3), endpoint(2, waiting=3, own_requests=3), endpoint(3)]
    assert by_key(scorer.score(cold, deep, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}


def test_placed_when_full_keeps_the_load_scorers_say_where_others_fill_the_queues() -> None:
    scorer, own = _full_with_own_queues()
    # Every server reports 3 requests, picker's own are 1 each: two thirds of the queues are other clients'.
    shared = [endpoint(i, waiting=3, own_requests=1) for i in (1, 2, 3)]
    cold = request(prompt="c" * (BLOCK * 2))
    for _ in range(150):
        scorer.score(cold, shared, CycleState())
    _come_back(scorer, 60)
    assert by_key(scorer.score(cold, shared, CycleState())) == {E1: 0.0, E2: 0.5, E3: 1.0}  # min-max, as before
    one_idle = [*shared[:2], endpoint(3, own_requests=1)]  # two waiting per server, but most of them others'
    # Not sharp: the queues of this moment decide, with the load scorers.
    assert by_key(scorer.score(cold, one_idle, CycleState())) == SOFT
    assert own  # the ledger's leases stand for picker's own request on each server


def test_placed_when_full_counts_a_slow_server_in_whole_multiples() -> None:
    cold = request(prompt="c" * (BLOCK * 2))
    spreads = {}
    for factor in (1.9, 2.5, 3.2):
        scorer = _filling(coldSpreadSpeedFrom="ttft")
        scorer.bind({"ttft": FixedSpeeds({E3: factor})}, ())
        _learn(scorer, request(prompt="z" * (BLOCK * 2)), EPS[2])
        spreads[factor] = by_key(scorer.score(cold, EPS, CycleState()))
    assert spreads[1.9] == SOFT  # under 2x: as fast
    assert spreads[2.5] == {E1: 0.0, E2: round(1 - 4 / 6, 9), E3: round(1 - 4 / 6, 9)}  # E3's 2 blocks count 4
    assert spreads[3.2] == {E1: 0.0, E2: round(1 - 4 / 6, 9), E3: 0.0}  # 6


def test_placed_when_full_reads_the_index_size_from_the_servers_kv_blocks() -> None:
    c = ctx()
    scorer = _scorer(c, coldSpread=1.0, coldSpreadPlacedWhenFull=True)  # autoTune: num_gpu_blocks, not the LRU
    pool = [replace(e, metrics=replace(e.metrics, num_gpu_blocks=2)) for e in EPS]
    for i, target in enumerate((pool[0], pool[0], pool[1])):
        _learn(scorer, request(prompt=f"{i}" * (BLOCK * 2)), target)
    cold = request(prompt="c" * (BLOCK * 2))
    assert by_key(scorer.score(cold, pool, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}  # E3 empty: held
    _learn(scorer, request(prompt="z" * (BLOCK * 2)), pool[2])
    assert by_key(scorer.score(cold, pool, CycleState())) == {E1: 0.0, E2: 0.5, E3: 0.5}  # placed: 4, 2, 2


def test_the_previous_default_spreads_by_placed_blocks_when_full() -> None:
    scorer = load_config(V2_CONFIG_TEXT, ctx()).plugins["prefix-cache-scorer"]
    assert isinstance(scorer, prefix.PrefixCacheScorer)
    assert scorer.params.cold_spread_placed_when_full
    assert prefix.Params().cold_spread_placed_when_full is False


def test_debt_limit_forgives_what_a_server_missed_beyond_one_prompt() -> None:
    cold = request(prompt="c" * (BLOCK * 2))  # 2 blocks
    spreads = {}
    for limit in (0.0, 1.0):
        scorer = _scorer(coldSpread=1.0, coldSpreadBasis="placed", coldSpreadDebtLimit=limit)
        for i, target in enumerate((EPS[0], EPS[0], EPS[0], EPS[1], EPS[1])):
            _learn(scorer, request(prompt=f"{i}" * (BLOCK * 2)), target)
        spreads[limit] = by_key(scorer.score(cold, EPS, CycleState()))  # placed: 6, 4 and 0 blocks
        # E3 takes the next new prompt: with the limit it had been owed 2 blocks, not 4, and is now level with E2.
        _learn(scorer, request(prompt="n" * (BLOCK * 2)), EPS[2])
        spreads[limit, "after"] = by_key(scorer.score(cold, EPS, CycleState()))
    assert spreads[0.0] == {E1: 0.0, E2: round(1 - 4 / 6, 9), E3: 1.0}
    assert spreads[1.0] == {E1: 0.0, E2: round(1 - 4 / 6, 9), E3: round(1 - 2 / 6, 9)}  # counted at 4 - 2
    assert spreads[0.0, "after"] == {E1: 0.0, E2: round(1 - 4 / 6, 9), E3: round(1 - 2 / 6, 9)}  # still owed
    assert spreads[1.0, "after"] == {E1: 0.0, E2: round(1 - 4 / 6, 9), E3: round(1 - 4 / 6, 9)}  # its turn taken


def test_debt_limit_leaves_an_orderly_round_and_the_held_basis_alone() -> None:
    cold = request(prompt="c" * (BLOCK * 2))
    for basis in ("placed", "held"):
        spreads = []
        for limit in (0.0, 1.0):
            scorer = _scorer(coldSpread=1.0, coldSpreadBasis=basis, coldSpreadDebtLimit=limit)
            # placed: 4, 4 and 2 blocks (E3 one prompt behind, its turn next); held: 6, 4 and 0, never raised
            targets = (EPS[0], EPS[0], EPS[1], EPS[1], EPS[2]) if basis == "placed" else (EPS[0],) * 3 + (EPS[1],) * 2
            for i, target in enumerate(targets):
                _learn(scorer, request(prompt=f"{i}" * (BLOCK * 2)), target)
            spreads.append(by_key(scorer.score(cold, EPS, CycleState())))
        assert spreads[0] == spreads[1], basis
    assert prefix.Params().cold_spread_debt_limit == 0.0
    with pytest.raises(ValidationError):
        prefix.Params(coldSpreadDebtLimit=-1)


def test_hot_prefix_cap_also_keeps_the_cold_spread_off_a_server_past_it() -> None:
    # A server with the least content (just recovered, just added) took every new prefix until its cache had
    # caught up; past the cap it gets none of the spread, and the load scorers choose among the rest.
    c = ctx()
    scorer = _scorer(c, coldSpread=1.0, maxLoadFactor=1.25, loadCapFloor=2)
    _learn(scorer, request(prompt="a" * (BLOCK * 2)), EPS[0])
    _learn(scorer, request(prompt="b" * (BLOCK * 2)), EPS[1])
    cold = request(prompt="c" * (BLOCK * 2))
    assert by_key(scorer.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.0, E3: 1.0}
    c.inflight.acquire(E3, 1, 0.0)
    assert by_key(scorer.score(cold, EPS, CycleState()))[E3] == 1.0  # 2 with this one: the floor allows it
    c.inflight.acquire(E3, 1, 0.0)
    # Σn + 1 = 3 over 3: cap max(ceil(1.25), 2) = 2; E3 would have 3.
    assert by_key(scorer.score(cold, EPS, CycleState())) == {E1: 0.0, E2: 0.0, E3: 0.0}


POOL = [endpoint(i) for i in range(1, 9)]


def _homes(scorer: prefix.PrefixCacheScorer, prompts: list[str], pool: list[Endpoint] = POOL) -> list[str]:
    """Where each cold prompt's spread goes (its best score; the first in pool order among equals), each prompt
    placed there after scoring. With coldSpreadHome one endpoint alone scores it."""
    out = []
    for text in prompts:
        scores = by_key(scorer.score(request(prompt=text), pool, CycleState()))
        home = max(scores, key=scores.__getitem__)
        if scorer.params.cold_spread_home:
            assert scores[home] == 1.0
            assert sum(scores.values()) == 1.0
        out.append(home)
        _learn(scorer, request(prompt=text), next(e for e in pool if e.key == home))
    return out


def test_cold_spread_home_sends_a_prefix_to_the_same_server_whatever_each_router_placed_before() -> None:
    # Two routers that cannot tell each other where they sent what (separate gateways, replicas without the
    # peer exchange): each has placed other prompts on its own servers, so their spreads pick different
    # servers for the same new system prompt; with a home both pick the same, from the prompt alone.
    new = [f"{g:04d}" * (BLOCK * 10 // 4) for g in range(40)]  # 640 tokens each, no shared block
    routers = {}
    for home in (False, True):
        a, b = (_scorer(coldSpread=1.0, coldSpreadHome=home) for _ in range(2))
        for i, e in enumerate(POOL[:4]):
            _learn(a, request(prompt=f"a{i}" * (BLOCK * 8)), e)
        for i, e in enumerate(POOL[4:]):
            _learn(b, request(prompt=f"b{i}" * (BLOCK * 8)), e)
        routers[home] = (_homes(a, new), _homes(b, new))
    spread_a, spread_b = routers[False]
    assert sum(x == y for x, y in zip(spread_a, spread_b, strict=True)) < 10
    home_a, home_b = routers[True]
    assert home_a == home_b
    # Spread over the pool by the hash (40 prefixes over 8 servers), not all onto one.
    assert len(set(home_a)) == len(POOL)
    assert max(home_a.count(k) for k in set(home_a)) <= 12


def test_cold_spread_home_is_keyed_on_the_prompts_first_tokens_and_kept_when_others_leave() -> None:
    scorer = _scorer(coldSpread=1.0, coldSpreadHome=True, coldSpreadHomeTokens=64)  # 4 blocks of 16 tokens
    system = "s" * (BLOCK * 4)
    questions = [system + f"{q:03d}?" * 40 for q in range(12)]  # same first 64 tokens, different questions
    homes = {_homes(_scorer(coldSpread=1.0, coldSpreadHome=True, coldSpreadHomeTokens=64), [q])[0] for q in questions}
    assert len(homes) == 1
    (home,) = homes
    # Rendezvous: another server leaving (or joining) does not move a home that stays.
    rest = [e for e in POOL if e.key == home] + [e for e in POOL if e.key != home][:3]
    assert _homes(scorer, questions[:1], rest) == [home]
    # Prompts that differ within the first 64 tokens are homed independently (all eight servers over 40).
    other = {_homes(_scorer(coldSpread=1.0, coldSpreadHome=True), [f"{g:04d}" * 100])[0] for g in range(40)}
    assert len(other) == len(POOL)


def test_cold_spread_home_skips_short_and_warm_prompts_and_keeps_the_cap() -> None:
    c = ctx()
    scorer = _scorer(c, coldSpread=1.0, coldSpreadHome=True, maxLoadFactor=1.25, loadCapFloor=1)
    short = request(prompt="c" * 100)  # 25 tokens: under coldSpreadSpeedMaxTokens, spread over all as before
    assert set(by_key(scorer.score(short, POOL, CycleState())).values()) == {1.0}
    long = request(prompt="d" * (BLOCK * 8))
    (home,) = (k for k, v in by_key(scorer.score(long, POOL, CycleState())).items() if v == 1.0)
    home_ep = next(e for e in POOL if e.key == home)
    c.inflight.acquire(home, 1, 0.0)
    c.inflight.acquire(home, 1, 0.0)  # past the cap: no spread anywhere, the load scorers decide
    assert set(by_key(scorer.score(long, POOL, CycleState())).values()) == {0.0}
    elsewhere = next(e for e in POOL if e.key != home)
    _learn(scorer, long, elsewhere)  # warm now: scored by what each server holds, the home is no longer asked
    assert by_key(scorer.score(long, POOL, CycleState()))[elsewhere.key] > 0.0
    assert scorer.cold_home(long, POOL, CycleState()) is None
    assert by_key(scorer.score(long, POOL, CycleState()))[home_ep.key] == 0.0
    with pytest.raises(ValidationError):
        prefix.Params(coldSpreadHomeTokens=0)
