"""A deterministic word-level tokenizer with byte fallback, shared by engine, server and load client.

Text is split into pieces (a word with its leading space, a number, a run of punctuation, whitespace), in the
style of GPT-2 pre-tokenisation. A piece in the vocabulary (``vocab.WORDS`` in four spellings: ``w``, `` w``,
``W``, `` W``) is one token; any other piece becomes one token per UTF-8 byte (ids 0-255). So:

* ``decode(encode(text)) == text`` for every string (lossless);
* every generated word (`` word``) is exactly one token, and text made of such words re-tokenises to the same
  tokens however it is cut into chunks at token boundaries (what inference-perf relies on when it
  re-tokenises streamed output on the client);
* an English-like text costs about one token per word, near a real tokenizer's ~4 characters per token.

No model, no files, no randomness: the ids depend only on the word list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

from picker.sim.vocab import WORDS

__all__ = ["BYTE_TOKENS", "Tokenizer", "default_tokenizer"]

BYTE_TOKENS = 256  # ids 0..255 are raw bytes

# GPT-2-like pieces: optional space + letters | optional space + digits | optional space + other symbols |
# whitespace not followed by a word (so the last space stays attached to the next word) | other whitespace.
_PIECE = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


class Tokenizer:
    """Word-level tokenizer over ``words``; unknown pieces fall back to bytes."""

    def __init__(self, words: Sequence[str] = WORDS) -> None:
        pieces: list[str] = []
        for word in words:
            cap = word[:1].upper() + word[1:]
            pieces.extend((word, " " + word, cap, " " + cap))
        self._id_of: dict[str, int] = {}
        for piece in pieces:
            self._id_of.setdefault(piece, BYTE_TOKENS + len(self._id_of))
        self._piece_of: list[bytes] = [bytes([b]) for b in range(BYTE_TOKENS)]
        self._piece_of.extend(p.encode() for p in self._id_of)
        self._text_of: list[str] = [chr(b) if b < 128 else "\ufffd" for b in range(BYTE_TOKENS)]
        self._text_of.extend(self._id_of)
        # Ids of " word" tokens, the alphabet of generated text.
        self.word_ids: tuple[int, ...] = tuple(self._id_of[" " + w] for w in dict.fromkeys(words))

    @property
    def vocab_size(self) -> int:
        return len(self._piece_of)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        id_of = self._id_of
        for piece in _PIECE.findall(text):
            token = id_of.get(piece)
            if token is None:
                ids.extend(piece.encode())
            else:
                ids.append(token)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        return b"".join(self._piece_bytes(i) for i in ids).decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        """The text of one token (a lone non-ASCII byte shows as U+FFFD)."""
        self._piece_bytes(token_id)
        return self._text_of[token_id]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def _piece_bytes(self, token_id: int) -> bytes:
        if not 0 <= token_id < len(self._piece_of):
            raise ValueError(f"token id {token_id} out of range [0, {len(self._piece_of)})")
        return self._piece_of[token_id]


@lru_cache(maxsize=1)
def default_tokenizer() -> Tokenizer:
    """The one shared instance (building the vocabulary once, not per caller)."""
    return Tokenizer()
