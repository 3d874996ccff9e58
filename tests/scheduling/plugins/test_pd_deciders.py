"""P/D deciders: prefix-based (llm-d), always, prompt length (picker's), multimodal (encode stage)."""

from __future__ import annotations

import logging

import orjson
import pytest

from picker.plugins import CycleState
from picker.scheduling.plugins import pd_deciders
from picker.scheduling.plugins.pd_deciders import (
    AlwaysDecider,
    MultimodalDecider,
    PrefixBasedDecider,
    PromptLengthDecider,
    input_tokens,
)
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from tests.conftest import endpoint, request

DECODE, OTHER = endpoint(1), endpoint(2)
PROMPT = "x" * 4000  # 1000 tokens at 4 bytes each


def _cycle(blocks: dict[str, int], block_chars: int = 64) -> CycleState:
    cycle = CycleState()
    cycle[MATCH_STATE] = PrefixMatch(blocks, 62, block_chars, len(PROMPT), 1000.0)
    return cycle


def test_input_tokens_are_utf8_bytes_over_four() -> None:
    assert input_tokens(request(prompt="abcdefgh")) == 2
    assert input_tokens(request(prompt="é" * 8)) == 4  # 16 bytes


@pytest.mark.parametrize(
    ("non_cached", "prompt_tokens", "blocks", "expected"),
    [
        (0, 0, {}, False),  # 0 disables disaggregation (llm-d ≥ 0.9)
        (2000, 0, {}, False),  # the prompt is shorter than the threshold
        (16, 0, {}, True),  # nothing cached on the decode endpoint: 1000 uncached tokens
        (16, 0, {DECODE.key: 62}, False),  # 62 blocks x 16 tokens = 992 cached: 8 left < 16
        (16, 0, {DECODE.key: 50}, True),  # 800 cached: 200 uncached ≥ 16
        (16, 0, {OTHER.key: 62}, True),  # another endpoint's cache does not count
        (16, 1500, {}, False),  # below the promptTokens gate
        (16, 800, {}, True),
    ],
)
def test_prefix_based_decider(non_cached: int, prompt_tokens: int, blocks: dict[str, int], expected: bool) -> None:
    decider = PrefixBasedDecider("d", non_cached, prompt_tokens)
    assert decider.decide(request(prompt=PROMPT), DECODE, _cycle(blocks)) is expected


def test_prefix_based_decider_without_a_prefix_match_is_decode_only_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    decider = PrefixBasedDecider("d", 16)
    with caplog.at_level(logging.WARNING, logger=pd_deciders.__name__):
        assert decider.decide(request(prompt=PROMPT), DECODE, CycleState()) is False
        assert decider.decide(request(prompt=PROMPT), DECODE, CycleState()) is False
    assert len([r for r in caplog.records if "no prefix match" in r.getMessage()]) == 1


def test_always_and_prompt_length_deciders() -> None:
    assert AlwaysDecider("a").decide(request(prompt="hi"), DECODE, CycleState())
    by_length = PromptLengthDecider("p", 512)
    assert by_length.decide(request(prompt="w" * 4 * 512), DECODE, CycleState())
    assert not by_length.decide(request(prompt="w" * 4 * 511), DECODE, CycleState())
    # Whatever the decode endpoint caches.
    assert by_length.decide(request(prompt="w" * 4 * 512), DECODE, _cycle({DECODE.key: 62}))


def test_multimodal_decider_looks_for_media_parts() -> None:
    def chat(content: object) -> bytes:
        return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": content}]})

    decider = MultimodalDecider("mm")
    image = chat([{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "x"}}])
    assert decider.decide(request(body=image, body_json=orjson.loads(image)), DECODE, CycleState())
    text = chat([{"type": "text", "text": "hello"}])
    assert not decider.decide(request(body=text, body_json=orjson.loads(text)), DECODE, CycleState())
    assert not decider.decide(request(), DECODE, CycleState())
