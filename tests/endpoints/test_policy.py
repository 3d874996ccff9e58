"""PoolPolicy: objective priorities and model-rewrite precedence and weighting (protocol.md §11)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from picker.endpoints.policy import (
    PolicyStore,
    PoolPolicy,
    RewriteRule,
    RewriteTarget,
    pick_target,
    priority_for,
    resolve_rewrite,
)

T0, T1 = 1_700_000_000.0, 1_700_000_100.0  # T0 older


def rule(
    name: str,
    models: tuple[str, ...] = (),
    targets: tuple[tuple[str, int], ...] = (("x", 0),),
    created_at: float = T0,
    index: int = 0,
) -> RewriteRule:
    return RewriteRule(name, created_at, index, frozenset(models), tuple(RewriteTarget(m, w) for m, w in targets))


def policy(*rules: RewriteRule) -> PoolPolicy:
    return PoolPolicy(rewrites=rules)


def test_priority_for() -> None:
    p = PoolPolicy(objectives={"critical": 10, "sheddable": -5, "unset": None})
    assert priority_for(p, "critical") == 10
    assert priority_for(p, "sheddable") == -5
    assert priority_for(p, "unset") == 0
    assert priority_for(p, "unknown") == 0
    assert priority_for(p, None) == 0
    assert priority_for(p, "") == 0


def test_no_rule_leaves_the_model() -> None:
    assert resolve_rewrite(PoolPolicy(), "m", random.Random(0)) == ("m", None)
    assert resolve_rewrite(policy(rule("r", ("other",))), "m", random.Random(0)) == ("m", None)


def test_exact_rule_beats_generic_even_when_generic_is_older() -> None:
    p = policy(rule("generic", (), (("fallback", 0),), created_at=T0), rule("exact", ("m",), (("m2", 0),), T1))
    assert resolve_rewrite(p, "m", random.Random(0)) == ("m2", "exact")
    assert resolve_rewrite(p, "other", random.Random(0)) == ("fallback", "generic")


def test_generic_rule_matches_every_model_even_an_empty_one() -> None:
    p = policy(rule("g", (), (("default", 0),)))
    assert resolve_rewrite(p, "", random.Random(0)) == ("default", "g")


def test_tie_goes_to_the_oldest_creation_timestamp() -> None:
    newer = rule("aaa-newer", ("m",), (("from-newer", 0),), created_at=T1)
    older = rule("zzz-older", ("m",), (("from-older", 0),), created_at=T0)
    assert resolve_rewrite(policy(newer, older), "m", random.Random(0)) == ("from-older", "zzz-older")
    gen_new, gen_old = rule("g1", (), (("n", 0),), T1), rule("g2", (), (("o", 0),), T0)
    assert resolve_rewrite(policy(gen_new, gen_old), "q", random.Random(0)) == ("o", "g2")


def test_same_timestamp_then_name_then_first_rule() -> None:
    second = rule("r", ("m",), (("second", 0),), index=1)
    first = rule("r", ("m",), (("first", 0),), index=0)
    assert resolve_rewrite(policy(second, first), "m", random.Random(0)) == ("first", "r")
    b, a = rule("b", ("m",), (("from-b", 0),)), rule("a", ("m",), (("from-a", 0),))
    assert resolve_rewrite(policy(b, a), "m", random.Random(0)) == ("from-a", "a")


def test_a_rule_matching_several_models() -> None:
    p = policy(rule("r", ("a", "b"), (("ab", 0),)))
    assert resolve_rewrite(p, "a", random.Random(0)) == ("ab", "r")
    assert resolve_rewrite(p, "b", random.Random(0)) == ("ab", "r")


def test_rules_without_targets_neither_match_nor_shadow() -> None:
    empty = rule("empty", ("m",), (), created_at=T0)
    real = rule("real", ("m",), (("m2", 0),), created_at=T1)
    assert resolve_rewrite(policy(empty, real), "m", random.Random(0)) == ("m2", "real")
    assert policy(empty).rewrites == ()


def test_weighted_draw_follows_weights() -> None:
    targets = (RewriteTarget("a", 90), RewriteTarget("b", 10))
    rng = random.Random(42)
    counts = Counter(pick_target(targets, rng) for _ in range(5000))
    assert 0.08 < counts["b"] / 5000 < 0.12


def test_weighted_draw_is_over_zero_to_total() -> None:
    class Fixed(random.Random):
        def __init__(self, value: int) -> None:
            super().__init__()
            self.value = value

        def randrange(self, *args: int, **kw: object) -> int:  # type: ignore[override]
            assert args == (10,)  # [0, Σweight)
            return self.value

    targets = (RewriteTarget("a", 3), RewriteTarget("b", 7))
    assert [pick_target(targets, Fixed(v)) for v in (0, 2, 3, 9)] == ["a", "a", "b", "b"]


def test_all_zero_weights_are_uniform() -> None:
    targets = (RewriteTarget("a"), RewriteTarget("b"), RewriteTarget("c"))
    rng = random.Random(7)
    counts = Counter(pick_target(targets, rng) for _ in range(3000))
    assert set(counts) == {"a", "b", "c"}
    assert all(800 < c < 1200 for c in counts.values())


def test_single_target_needs_no_draw() -> None:
    class NoDraw(random.Random):
        def randrange(self, *args: int, **kw: object) -> int:  # type: ignore[override]
            raise AssertionError("no draw expected")

    assert pick_target((RewriteTarget("only", 5),), NoDraw()) == "only"


def test_policy_is_a_value() -> None:
    a = PoolPolicy(objectives={"o": 1}, rewrites=(rule("x", ("m",)), rule("y", ())))
    b = PoolPolicy(objectives={"o": 1}, rewrites=(rule("y", ()), rule("x", ("m",))))
    assert a == b  # rules are kept in precedence order whatever order they come in
    with pytest.raises(TypeError):
        a.objectives["o"] = 2  # type: ignore[index]


def test_policy_store_publishes_changes_only() -> None:
    store = PolicyStore()
    seen: list[PoolPolicy] = []
    store.subscribe(seen.append)
    assert store.current() == PoolPolicy()
    assert not store.publish(PoolPolicy())
    assert store.publish(PoolPolicy(objectives={"o": 1}))
    assert not store.publish(PoolPolicy(objectives={"o": 1}))
    assert store.current().objectives == {"o": 1}
    assert len(seen) == 1
