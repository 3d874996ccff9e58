"""Block keys: the chained hashes that name a prompt's KV blocks, computed from token ids.

A sequence's tokens are cut into blocks of the server's block size; the trailing partial block is dropped (a
server caches only full blocks). Each full block's key stands for the whole prefix up to it:

    root  = xxh3_64(name, seed=hash_seed)          name: the LoRA adapter, else the model
    key_i = xxh3_64(tokens of block i as little-endian uint32, seed=key_{i-1})

This is the structure of llm-d-kv-cache's request keys (≥ v0.5: block size, partial tail dropped, hash seed and
model or adapter in the root, parent chained into each key), with xxh3-64 in place of FNV-64a over canonical
CBOR. The keys never leave picker: the KV-event index maps each server's own block hashes (the *engine* keys of
its ``BlockStored`` events) to these keys computed from the event's ``token_ids`` ("dual key"), so the hash
function is picker's choice, and xxh3 (C, in ``xxhash``) costs ~0.2 µs a block where FNV-64a over CBOR in
Python costs microseconds. Blocks of different sizes give different keys (a block's bytes are 4 x its size),
so keys of servers with different block sizes never collide by accident.

The chain runs in C when picker's extension is built (``picker.kvcache._native``: XXH3 from its specification, one
call per prompt instead of one ``xxhash`` call per block, a list's ids converted in the same call);
``block_keys_python`` is its twin and the fallback (no compiler at install, or ``PICKER_NATIVE=0``), and
tests/kvcache/test_native.py checks both equal.

The simulator's block pool hashes its blocks the same way (``picker.sim.kvcache``).
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Callable, Sequence
from typing import Any

import xxhash

__all__ = ["MAX_TOKEN_ID", "NATIVE", "block_keys", "block_keys_python", "hash_seed_value", "root_key"]

_xxh3 = xxhash.xxh3_64_intdigest
MAX_TOKEN_ID = 0xFFFF_FFFF  # token ids are hashed as uint32


def _load_native() -> (
    tuple[Callable[[memoryview, int, int, int], list[int]], Callable[[Any, int, int, int], list[int] | None]] | None
):
    """The C chains (over a buffer of uint32 bytes, over a list or tuple of ids), or None when they are not built
    or ``PICKER_NATIVE`` is ``0`` (as picker.scheduling.native)."""
    if os.environ.get("PICKER_NATIVE", "1") == "0":
        return None
    try:
        from picker.kvcache import _native
    except ImportError:  # not built (no compiler at install): the Python chain
        return None
    if not hasattr(_native, "token_keys"):  # an extension built from an older source: the Python chain
        return None
    return _native.block_keys, _native.token_keys


_native_chains = _load_native()
NATIVE = _native_chains is not None


def hash_seed_value(seed: str | int) -> int:
    """The numeric hash seed of a ``hashSeed`` setting (vLLM's ``PYTHONHASHSEED``): ``""`` is 0, digits are
    the number (mod 2^64), anything else is hashed."""
    if isinstance(seed, int):
        return seed & 0xFFFF_FFFF_FFFF_FFFF
    text = seed.strip()
    if not text:
        return 0
    if text.isdigit():
        return int(text) & 0xFFFF_FFFF_FFFF_FFFF
    return _xxh3(text.encode())


def root_key(name: str, seed: int = 0) -> int:
    """The parent of a sequence's first block: the model (or LoRA adapter) name under the hash seed."""
    return _xxh3(name.encode(), seed=seed)


def block_keys(tokens: Sequence[int], block_size: int, parent: int, max_blocks: int | None = None) -> list[int]:
    """Keys of the full blocks of ``tokens`` (at most ``max_blocks``), chained from ``parent``.

    Raises ``ValueError`` for a token id outside [0, 2^32) or a block size below 1.
    """
    chains = _native_chains
    if chains is None:
        return block_keys_python(tokens, block_size, parent, max_blocks)
    if type(tokens) is list or type(tokens) is tuple:  # a tokenizer's answer: converted in C, no array copy
        n = _count(tokens, block_size, max_blocks)
        if n <= 0:
            return []
        try:
            found = chains[1](tokens, block_size, parent, n)
        except OverflowError as exc:
            raise ValueError(f"token ids must be integers in [0, {MAX_TOKEN_ID}]") from exc
        if found is not None:
            return found
        # an id that is not an int (numpy's): converted by array('I') below, as the Python chain does
    n, data = _blocks(tokens, block_size, max_blocks)
    return chains[0](data, 4 * block_size, parent, n) if n else []


def block_keys_python(tokens: Sequence[int], block_size: int, parent: int, max_blocks: int | None = None) -> list[int]:
    """``block_keys`` with one ``xxhash`` call per block: the C chain's twin."""
    n, data = _blocks(tokens, block_size, max_blocks)
    step = 4 * block_size
    out: list[int] = []
    append = out.append
    for start in range(0, n * step, step):
        parent = _xxh3(data[start : start + step], seed=parent)
        append(parent)
    return out


def _blocks(tokens: Sequence[int], block_size: int, max_blocks: int | None) -> tuple[int, memoryview]:
    """How many full blocks to key, and the tokens' uint32 bytes (at least that many blocks')."""
    n = _count(tokens, block_size, max_blocks)
    if n <= 0:
        return 0, memoryview(b"")
    try:
        if isinstance(tokens, array) and tokens.typecode == "I":
            return n, memoryview(tokens).cast("B")
        return n, memoryview(array("I", tokens[: n * block_size])).cast("B")
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"token ids must be integers in [0, {MAX_TOKEN_ID}]") from exc


def _count(tokens: Sequence[int], block_size: int, max_blocks: int | None) -> int:
    """The full blocks of ``tokens`` to key (at most ``max_blocks``)."""
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    n = len(tokens) // block_size
    return n if max_blocks is None else min(n, max_blocks)
