"""session-affinity-scorer and no-hit-lru-scorer."""

from __future__ import annotations

import base64
import dataclasses

from picker.endpoints.model import Endpoint
from picker.plugins import Category, CycleState, ProfileResult, SchedulingResult
from picker.scheduling.plugins import no_hit_lru, prefix, session_affinity
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch, match_key
from tests.conftest import endpoint, request
from tests.scheduling.helpers import by_key, ctx

E1, E2, E3, E4 = (dataclasses.replace(endpoint(i), name=f"vllm-{i}-rank-0") for i in range(1, 5))
EPS = [E1, E2, E3]


def _token(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


# -- session-affinity-scorer ---------------------------------------------------------------------------------


def test_session_token_names_namespace_and_pod() -> None:
    assert session_affinity.session_token(E2, "prod") == _token("prod/vllm-2-rank-0")
    assert session_affinity.decode_token(session_affinity.session_token(E2)) == "/vllm-2-rank-0"
    assert session_affinity.decode_token("%%%") is None


def test_session_affinity_scores_the_named_pod_only() -> None:
    scorer = session_affinity.create("s", session_affinity.Params(), ctx())
    req = request(headers={"x-session-token": _token("default/vllm-2-rank-0")})
    assert by_key(scorer.score(req, EPS, CycleState())) == {E1.key: 0.0, E2.key: 1.0, E3.key: 0.0}
    assert scorer.category is Category.AFFINITY


def test_session_affinity_round_trips_its_own_tokens_and_ip_port() -> None:
    scorer = session_affinity.SessionAffinityScorer("s", namespace="prod")
    token = scorer.response_headers(E3)["x-session-token"]
    assert by_key(scorer.score(request(headers={"x-session-token": token}), EPS, CycleState()))[E3.key] == 1.0
    by_ip = request(headers={"x-session-token": _token(E1.key)})
    assert by_key(scorer.score(by_ip, EPS, CycleState()))[E1.key] == 1.0


def test_session_affinity_without_or_with_a_bad_token_scores_zero() -> None:
    scorer = session_affinity.create("s", session_affinity.Params(), ctx())
    for headers in ({}, {"x-session-token": "not base64!"}, {"x-session-token": _token("ns/gone-pod")}):
        assert set(by_key(scorer.score(request(headers=headers), EPS, CycleState())).values()) == {0.0}


# -- no-hit-lru-scorer -------------------------------------------------------------------------------------------


def _cold(cycle: CycleState | None = None) -> CycleState:
    cycle = cycle if cycle is not None else CycleState()
    cycle[MATCH_STATE] = PrefixMatch({}, 4, 64, 256, 64.0)
    return cycle


def _result(target: Endpoint, cycle: CycleState, prefill: Endpoint | None = None) -> SchedulingResult:
    results: dict[str, ProfileResult | None] = {"decode": ProfileResult((target,))}
    if prefill is not None:
        results["prefill"] = ProfileResult((prefill,))
    return SchedulingResult((target,), "decode", (), results, cycle=cycle)


def _lru(**params: object) -> no_hit_lru.NoHitLRUScorer:
    scorer = no_hit_lru.create("lru", no_hit_lru.Params.model_validate(params), ctx())
    assert isinstance(scorer, no_hit_lru.NoHitLRUScorer)
    return scorer


def test_a_hit_anywhere_is_neutral() -> None:
    scorer = _lru()
    cycle = CycleState()
    cycle[MATCH_STATE] = PrefixMatch({E3.key: 1}, 4, 64, 256, 64.0)
    assert set(by_key(scorer.score(request(), EPS, cycle)).values()) == {0.5}
    scorer.pre_request(request(), _result(E1, cycle))
    assert scorer.lru == []  # only cold requests move the LRU


def test_cold_requests_rank_never_used_first_then_least_recently_used() -> None:
    scorer = _lru()
    assert by_key(scorer.score(request(), EPS, _cold())) == {E1.key: 1.0, E2.key: 0.5, E3.key: 0.0}
    for target in (E2, E1):  # E2 used, then E1: E3 never used, E2 least recent
        cycle = _cold()
        scorer.score(request(), EPS, cycle)
        scorer.pre_request(request(), _result(target, cycle))
    assert scorer.lru == [E2.key, E1.key]
    assert by_key(scorer.score(request(), EPS, _cold())) == {E3.key: 1.0, E2.key: 0.5, E1.key: 0.0}


def test_lru_rank_counts_endpoints_outside_the_candidates_and_floors_at_zero() -> None:
    scorer = _lru()
    for target in (E4, E3, E2, E1):
        cycle = _cold()
        scorer.score(request(), [E1, E2, E3, E4], cycle)
        scorer.pre_request(request(), _result(target, cycle))
    # Candidates E1, E2 only (N = 2): E2 at LRU position 2 ⇒ 1 - 2/1 < 0 ⇒ 0; E1 at 3 ⇒ 0.
    assert by_key(scorer.score(request(), [E1, E2], _cold())) == {E1.key: 0.0, E2.key: 0.0}
    assert by_key(scorer.score(request(), [E1], _cold())) == {E1.key: 1.0}


def test_missing_prefix_state_is_cold_and_prefill_target_is_touched() -> None:
    scorer = _lru()
    cycle = CycleState()
    assert by_key(scorer.score(request(), EPS, cycle)) == {E1.key: 1.0, E2.key: 0.5, E3.key: 0.0}
    scorer.pre_request(request(), _result(E2, cycle, prefill=E3))
    assert scorer.lru == [E2.key, E3.key]


def test_pre_request_without_a_score_in_the_cycle_does_nothing() -> None:
    scorer = _lru()
    scorer.pre_request(request(), _result(E1, CycleState()))
    assert scorer.lru == []


def test_lru_size_bound_and_departed_endpoints() -> None:
    scorer = _lru(lruSize=2)
    for target in (E1, E2, E3):
        cycle = _cold()
        scorer.score(request(), EPS, cycle)
        scorer.pre_request(request(), _result(target, cycle))
    assert scorer.lru == [E2.key, E3.key]
    scorer.endpoints_changed(frozenset({E3.key}))
    assert scorer.lru == [E3.key]


def test_reads_the_named_prefix_plugin_and_a_real_prefix_scorer() -> None:
    pfx = prefix.create("approx", prefix.Params(), ctx())
    assert isinstance(pfx, prefix.PrefixCacheScorer)
    scorer = _lru(prefixPluginName="approx")
    req = request(prompt="p" * 300)
    cycle = CycleState()
    pfx.score(req, EPS, cycle)
    assert isinstance(cycle[match_key("approx")], PrefixMatch)
    assert by_key(scorer.score(req, EPS, cycle))[E1.key] == 1.0  # nothing learned yet: cold
    pfx.pre_request(req, _result(E2, cycle))
    warm = CycleState()
    pfx.score(req, EPS, warm)
    assert set(by_key(scorer.score(req, EPS, warm)).values()) == {0.5}
