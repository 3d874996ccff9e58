"""Workloads: deterministic for a seed, exact token lengths for the simulator's tokenizer, right shapes."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest

from picker.bench import workloads as wl
from picker.sim.tokenizer import default_tokenizer

TOK = default_tokenizer()


def ntok(text: str) -> int:
    return len(TOK.encode(text))


@pytest.mark.parametrize(
    "make",
    [
        lambda s: wl.shared_prefix(seed=s),
        lambda s: wl.multi_turn_chat(seed=s),
        lambda s: wl.short_long(seed=s),
        lambda s: wl.sharegpt_like(seed=s),
        lambda s: wl.fixed_lengths(seed=s),
    ],
)
def test_same_seed_same_items_other_seed_other_items(make: object) -> None:
    a, b, c = make(1), make(1), make(2)  # type: ignore[operator]
    assert a.take(30) == b.take(30)
    assert a.take(30) == a.take(30)  # restartable
    assert a.take(30) != c.take(30)


def test_shared_prefix_groups_share_the_system_prompt() -> None:
    w = wl.shared_prefix(num_groups=3, prompts_per_group=4, system_prompt_len=100, question_len=20, output_len=7)
    items = w.take(24)  # two passes
    assert Counter(i.tag for i in items) == {"g0": 8, "g1": 8, "g2": 8}
    systems: dict[str, set[str]] = {i.tag: set() for i in items}
    for item in items:
        (role_s, system), (role_u, question) = item.messages
        assert (role_s, role_u) == ("system", "user")
        assert (ntok(system), ntok(question), item.max_tokens) == (100, 20, 7)
        systems[item.tag].add(system)
    assert all(len(s) == 1 for s in systems.values())
    assert len({next(iter(s)) for s in systems.values()}) == 3
    assert len({i.prompt for i in items[:12]}) == 12  # every prompt once per pass


def test_multi_turn_prompts_extend_the_previous_turn() -> None:
    w = wl.multi_turn_chat(sessions=2, turns=3, system_prompt_len=10, question_len=5, answer_len=6, output_len=4)
    items = w.take(6)
    assert [i.tag for i in items] == ["s0", "s1"] * 3
    s0 = [i for i in items if i.tag == "s0"]
    for earlier, later in itertools.pairwise(s0):
        assert later.messages[: len(earlier.messages)] == earlier.messages
        assert later.messages[len(earlier.messages)][0] == "assistant"
    assert ntok(s0[2].prompt) == 10 + 3 * 5 + 2 * 6
    assert wl.multi_turn_chat(sessions=2, turns=1).take(4)[2].tag == "s2"  # new sessions after the last turn


def test_short_long_mix() -> None:
    items = wl.short_long(long_fraction=0.25, seed=3).take(400)
    tags = Counter(i.tag for i in items)
    assert 70 < tags["long"] < 130
    for i in items:
        n = 512 if i.tag == "long" else 4
        assert (i.max_tokens, i.min_tokens, i.ignore_eos) == (n, n, True)
        assert ntok(i.prompt) == 13


def test_sharegpt_like_lengths() -> None:
    items = wl.sharegpt_like(seed=0, max_prompt=1000, max_output=500).take(500)
    ins = sorted(ntok(i.prompt) for i in items)
    outs = sorted(i.max_tokens for i in items)
    assert 80 < ins[250] < 180  # median near 120
    assert 100 < outs[250] < 220  # median near 150
    assert ins[0] >= 4
    assert ins[-1] <= 1000
    assert outs[-1] <= 500


def test_multi_lora_weights_and_fixed() -> None:
    w = wl.with_fixed(wl.multi_lora(wl.fixed_lengths(), ["a", "b", "c"], [60, 30, 10], seed=1), 9)
    items = w.take(1000)
    models = Counter(i.model for i in items)
    assert 550 < models["a"] < 650
    assert 250 < models["b"] < 350
    assert 60 < models["c"] < 140
    assert all((i.max_tokens, i.min_tokens, i.ignore_eos) == (9, 9, True) for i in items)
    with pytest.raises(ValueError, match="at least one adapter"):
        wl.multi_lora(wl.fixed_lengths(), [])
    with pytest.raises(ValueError, match="one non-negative weight"):
        wl.multi_lora(wl.fixed_lengths(), ["a"], [1, 2])
    with pytest.raises(ValueError, match="n_tokens"):
        wl.with_fixed(wl.fixed_lengths(), 0)


def test_request_bodies() -> None:
    item = wl.WorkItem(messages=(("system", " a"), ("user", " b")), max_tokens=5, min_tokens=5, ignore_eos=True)
    chat = item.body("chat", "m")
    assert chat["messages"] == [{"role": "system", "content": " a"}, {"role": "user", "content": " b"}]
    assert chat["stream_options"] == {"include_usage": True}
    comp = item.body("completions", "m", stream=False)
    assert comp["prompt"] == " a b"
    assert (comp["model"], comp["max_tokens"], comp["min_tokens"], comp["ignore_eos"]) == ("m", 5, 5, True)
    assert "stream_options" not in comp
    assert wl.WorkItem(messages=(), max_tokens=1, model="lora").body("chat", "m")["model"] == "lora"
