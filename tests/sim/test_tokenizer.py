"""The shared tokenizer: lossless, deterministic, one token per generated word."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from picker.sim.tokenizer import BYTE_TOKENS, Tokenizer, default_tokenizer
from picker.sim.vocab import WORDS

TOK = default_tokenizer()


@given(st.text())
def test_decode_inverts_encode(text: str) -> None:
    assert TOK.decode(TOK.encode(text)) == text


def test_known_words_are_single_tokens_and_others_bytes() -> None:
    assert len(TOK.encode(" the")) == 1
    assert len(TOK.encode("The")) == 1
    assert TOK.encode("zq") == [ord("z"), ord("q")]
    assert TOK.encode("é") == list("é".encode())
    assert all(t < BYTE_TOKENS for t in TOK.encode("\n\t!?"))


def test_ids_do_not_depend_on_the_instance() -> None:
    assert Tokenizer().encode("the cat sat") == TOK.encode("the cat sat")
    assert TOK.vocab_size == BYTE_TOKENS + 4 * len(WORDS)


def test_generated_text_streams_one_token_per_chunk() -> None:
    rng = random.Random(1)
    ids = [rng.choice(TOK.word_ids) for _ in range(200)]
    pieces = [TOK.token_text(i) for i in ids]
    assert all(len(TOK.encode(p)) == 1 for p in pieces)
    assert TOK.encode("".join(pieces)) == ids  # re-tokenising the stream gives the same tokens


def test_whitespace_runs_keep_the_last_space_with_the_word() -> None:
    ids = TOK.encode("a  cat")
    assert TOK.token_text(ids[-1]) == " cat"
    assert TOK.decode(ids) == "a  cat"


def test_out_of_range_id_raises() -> None:
    for bad in (-1, TOK.vocab_size):
        try:
            TOK.decode([bad])
        except ValueError:
            continue
        raise AssertionError(f"{bad} accepted")
