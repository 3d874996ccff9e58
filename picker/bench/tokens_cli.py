"""``picker tokens``: the tokens of a text, as a server counts them (``/tokenize``), checked by ``/detokenize``.

    picker tokens --url http://127.0.0.1:8000 "The cat sat on the mat."
    echo "some text" | picker tokens -

Prints the count, the ids and each token's text; exits 1 when ``/detokenize`` does not give the text back.
``--local`` uses the simulator's tokenizer in-process instead of a server.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from dataclasses import dataclass

import aiohttp
import orjson

from picker.bench.load import detokenize, tokenize
from picker.sim.tokenizer import default_tokenizer

__all__ = ["TokenReport", "configure", "run", "token_report"]


@dataclass(frozen=True, slots=True)
class TokenReport:
    text: str
    tokens: list[int]
    pieces: list[str]
    round_trip: str

    @property
    def ok(self) -> bool:
        return self.round_trip == self.text


async def token_report(base_url: str, text: str, model: str | None = None) -> TokenReport:
    """Tokenize ``text`` on the server, then detokenize the whole and each token (the seed's check)."""
    base_url = base_url.rstrip("/")
    async with aiohttp.ClientSession() as session:
        tokens, pieces = await tokenize(base_url, text, session, model, with_pieces=True)
        whole = await detokenize(base_url, tokens, session, model)
        if pieces is None:  # a server without return_token_strs: ask per token (bounded)
            pieces = [await detokenize(base_url, [t], session, model) for t in tokens[:_MAX_PIECE_CALLS]]
    return TokenReport(text, tokens, pieces, whole)


_MAX_PIECE_CALLS = 256


def local_report(text: str) -> TokenReport:
    tok = default_tokenizer()
    ids = tok.encode(text)
    return TokenReport(text, ids, [tok.token_text(i) for i in ids], tok.decode(ids))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("text", nargs="*", help="the text (several words are joined by spaces; '-' reads stdin)")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model")
    parser.add_argument("--local", action="store_true", help="use the simulator's tokenizer, no server")
    parser.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.text in ([], ["-"]) else " ".join(args.text)
    try:
        report = local_report(text) if args.local else asyncio.run(token_report(args.url, text, args.model))
    except (aiohttp.ClientError, OSError, KeyError, ValueError) as exc:
        print(f"picker tokens: {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        doc = {"count": len(report.tokens), "tokens": report.tokens, "pieces": report.pieces, "round_trip": report.ok}
        print(orjson.dumps(doc).decode())
    else:
        print(f"{len(report.tokens)} tokens")
        print(" ".join(str(t) for t in report.tokens))
        print("|".join(report.pieces))
        print("round trip: " + ("ok" if report.ok else f"MISMATCH: {report.round_trip!r}"))
    return 0 if report.ok else 1
