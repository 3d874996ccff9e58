"""Seeded, locally generated workloads for the load client (reference/landscape.md §4).

A workload is an endless, deterministic stream of ``WorkItem``s (the load run caps it). Text is drawn from the
simulator's word list, so every generated word is exactly one token for the simulator's tokenizer (`` word``)
and a length given in tokens is exact against ``picker sim`` (against a real model it is ~1 token per word).

* ``shared_prefix``: inference-perf ``shared_prefix``: groups of prompts sharing a system prompt, each with its
  own question; items in a seeded shuffled order, reshuffled every pass.
* ``multi_turn_chat``: sessions whose turn k repeats turns 1..k-1 (question + a synthetic answer) and adds a
  question, so each turn's prompt extends the previous one; sessions interleave round-robin.
* ``short_long``: the seed's mix: a short prompt answered with a few tokens, or a 512-token stream.
* ``seed_mix``: the seed's own mix, as the ``cpu`` preset is calibrated: 70 % "Say OK." (13 prompt tokens, 4 answer
  tokens), 30 % the BGP paragraph (116 prompt tokens, 512 answer tokens); every length fixed.
* ``sharegpt_like``: ShareGPT-shaped lengths (lognormal prompt and answer lengths, clipped).
* ``fixed_lengths``: every prompt and answer of one given length.
* ``multi_lora`` wraps any workload and sends each item to an adapter drawn with skewed weights;
  ``with_fixed`` forces every answer to exactly N tokens (``min_tokens = max_tokens = N``, ``ignore_eos``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from picker.sim.vocab import WORDS

__all__ = [
    "Api",
    "WorkItem",
    "Workload",
    "fixed_lengths",
    "multi_lora",
    "multi_turn_chat",
    "seed_mix",
    "shared_prefix",
    "sharegpt_like",
    "short_long",
    "with_fixed",
]

Api = Literal["chat", "completions"]


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One request to send: the conversation so far, the answer length, and labels for the report."""

    messages: tuple[tuple[str, str], ...]  # (role, content); completions send the contents concatenated
    max_tokens: int
    min_tokens: int | None = None
    ignore_eos: bool = False
    model: str | None = None  # e.g. a LoRA adapter; None = the run's model
    tag: str = ""

    @property
    def prompt(self) -> str:
        return "".join(content for _, content in self.messages)

    def body(self, api: Api, model: str, *, stream: bool = True) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model or model, "max_tokens": self.max_tokens, "stream": stream}
        if api == "chat":
            body["messages"] = [{"role": r, "content": c} for r, c in self.messages]
        else:
            body["prompt"] = self.prompt
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.min_tokens is not None:
            body["min_tokens"] = self.min_tokens
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass(frozen=True)
class Workload:
    """A named, restartable item stream: each ``iter()`` starts the same sequence again."""

    name: str
    make: Callable[[], Iterator[WorkItem]]

    def __iter__(self) -> Iterator[WorkItem]:
        return self.make()

    def take(self, n: int) -> list[WorkItem]:
        return list(itertools.islice(self, n))


def _text(rng: random.Random, n_tokens: int) -> str:
    return "".join(" " + w for w in rng.choices(WORDS, k=n_tokens))


def shared_prefix(
    *,
    num_groups: int = 8,
    prompts_per_group: int = 8,
    system_prompt_len: int = 512,
    question_len: int = 64,
    output_len: int = 64,
    seed: int = 0,
) -> Workload:
    if min(num_groups, prompts_per_group, system_prompt_len, question_len, output_len) < 1:
        raise ValueError("shared_prefix: every size must be >= 1")

    def make() -> Iterator[WorkItem]:
        rng = random.Random(seed)
        systems = [_text(rng, system_prompt_len) for _ in range(num_groups)]
        questions = [[_text(rng, question_len) for _ in range(prompts_per_group)] for _ in range(num_groups)]
        order = [(g, q) for g in range(num_groups) for q in range(prompts_per_group)]
        while True:
            rng.shuffle(order)
            for g, q in order:
                yield WorkItem(
                    messages=(("system", systems[g]), ("user", questions[g][q])), max_tokens=output_len, tag=f"g{g}"
                )

    return Workload("shared-prefix", make)


def multi_turn_chat(
    *,
    sessions: int = 8,
    turns: int = 4,
    system_prompt_len: int = 256,
    question_len: int = 32,
    answer_len: int = 64,
    output_len: int = 64,
    seed: int = 0,
) -> Workload:
    if min(sessions, turns, system_prompt_len, question_len, answer_len, output_len) < 1:
        raise ValueError("multi_turn_chat: every size must be >= 1")

    def make() -> Iterator[WorkItem]:
        rng = random.Random(seed)
        for wave in itertools.count():
            histories = [[("system", _text(rng, system_prompt_len))] for _ in range(sessions)]
            for _turn in range(turns):
                for s, history in enumerate(histories):
                    history.append(("user", _text(rng, question_len)))
                    yield WorkItem(messages=tuple(history), max_tokens=output_len, tag=f"s{wave * sessions + s}")
                    history.append(("assistant", _text(rng, answer_len)))

    return Workload("multi-turn-chat", make)


def short_long(
    *,
    short_prompt_len: int = 13,
    short_output: int = 4,
    long_prompt_len: int = 13,
    long_output: int = 512,
    long_fraction: float = 0.2,
    seed: int = 0,
) -> Workload:
    if not 0.0 <= long_fraction <= 1.0:
        raise ValueError("short_long: long_fraction must be in [0, 1]")

    def make() -> Iterator[WorkItem]:
        rng = random.Random(seed)
        while True:
            long = rng.random() < long_fraction
            n_in, n_out = (long_prompt_len, long_output) if long else (short_prompt_len, short_output)
            yield WorkItem(
                messages=(("user", _text(rng, n_in)),),
                max_tokens=n_out,
                min_tokens=n_out,
                ignore_eos=True,
                tag="long" if long else "short",
            )

    return Workload("short-long", make)


SEED_SHORT_PROMPT_TOKENS = 13  # "Say OK." after the chat template
SEED_LONG_PROMPT_TOKENS = 116  # "Write a detailed paragraph about BGP", as the seed's TTFT makes it (docs/simulator.md)


def seed_mix(*, long_fraction: float = 0.3, long_output: int = 512, seed: int = 0) -> Workload:
    """The seed's mix: ``short_long`` with the seed's lengths, tagged ``short`` and ``long``. Each prompt is its own
    words (no prefix shared by chance), every answer's length fixed (``min_tokens = max_tokens``, ``ignore_eos``)."""
    inner = short_long(
        short_prompt_len=SEED_SHORT_PROMPT_TOKENS,
        short_output=4,
        long_prompt_len=SEED_LONG_PROMPT_TOKENS,
        long_output=long_output,
        long_fraction=long_fraction,
        seed=seed,
    )
    return Workload("seed-mix", inner.make)


def sharegpt_like(
    *,
    prompt_median: int = 120,
    output_median: int = 150,
    sigma: float = 1.0,
    max_prompt: int = 2048,
    max_output: int = 1024,
    seed: int = 0,
) -> Workload:
    """Lognormal lengths (median, shape ``sigma``), clipped to [4, max_prompt] and [1, max_output]."""

    def make() -> Iterator[WorkItem]:
        rng = random.Random(seed)
        mu_in, mu_out = math.log(prompt_median), math.log(output_median)
        while True:
            n_in = min(max_prompt, max(4, round(rng.lognormvariate(mu_in, sigma))))
            n_out = min(max_output, max(1, round(rng.lognormvariate(mu_out, sigma))))
            yield WorkItem(messages=(("user", _text(rng, n_in)),), max_tokens=n_out, tag="sharegpt")

    return Workload("sharegpt-like", make)


def fixed_lengths(*, prompt_len: int = 256, output_len: int = 128, seed: int = 0) -> Workload:
    def make() -> Iterator[WorkItem]:
        rng = random.Random(seed)
        while True:
            yield WorkItem(messages=(("user", _text(rng, prompt_len)),), max_tokens=output_len, tag="fixed")

    return Workload("fixed", make)


def multi_lora(
    inner: Workload, adapters: Sequence[str], weights: Sequence[float] | None = None, *, seed: int = 0
) -> Workload:
    """Send each item of ``inner`` to an adapter drawn by ``weights`` (GIE's regression mix: 60/30/10)."""
    if not adapters:
        raise ValueError("multi_lora: need at least one adapter")
    if weights is not None and (len(weights) != len(adapters) or any(w < 0 for w in weights) or sum(weights) <= 0):
        raise ValueError("multi_lora: one non-negative weight per adapter, not all zero")

    def make() -> Iterator[WorkItem]:
        rng = random.Random(seed)
        for item in inner:
            adapter = rng.choices(adapters, weights=weights)[0]
            yield dataclasses.replace(item, model=adapter, tag=f"{item.tag}/{adapter}" if item.tag else adapter)

    return Workload(f"{inner.name}+lora", make)


def with_fixed(inner: Workload, n_tokens: int) -> Workload:
    """Every answer exactly ``n_tokens`` long (the seed's ``--fixed N``)."""
    if n_tokens < 1:
        raise ValueError("with_fixed: n_tokens must be >= 1")

    def make() -> Iterator[WorkItem]:
        for item in inner:
            yield dataclasses.replace(item, max_tokens=n_tokens, min_tokens=n_tokens, ignore_eos=True)

    return Workload(inner.name, make)
