"""The approximate prefix index: which endpoints have recently been sent which prompt blocks.

Block hashes (scheduling.md §4): the prompt text's UTF-8 bytes cut into blocks of ``block_bytes`` (block size in
tokens x 4 characters; the reference cuts bytes too), truncated to ``max_blocks``; the trailing partial block is
hashed as well; a prompt shorter than one block has no hashes. h₀ = xxh64(target model ‖ cache_salt),
hᵢ = xxh64(blockᵢ ‖ little-endian uint64(hᵢ₋₁)): each hash stands for the whole prefix up to its block.

The index maps hash → the endpoint key holding it (a plain ``str``) or, once several hold it, a set of keys; one
LRU of hashes per endpoint (capacity in blocks). Most hashes have a single holder, and a ``str`` is not tracked by
Python's cyclic GC while a ``set`` is: with a set per hash, a full index (31 250 blocks per endpoint) made each full
collection walk half a million containers (~0.2 s pauses at 16 endpoints, measured). Learning
inserts a request's hashes from last to first, so a prefix's first blocks are the most recently used and are
evicted after their extensions (the match walk stops at the first hash nobody holds, so an evicted first
block would hide every later one).

Native speed: ``prefix_hashes`` and the whole index (``PrefixIndex``: learning, eviction, the match walk) run in
``picker.scheduling._native`` (a small C extension that ``scripts/install.sh`` builds; ``scheduling.native``)
unless ``PICKER_NATIVE=0``. The pure-Python ``py_prefix_hashes`` and ``PyPrefixIndex`` define the results and are
the fallback; ``tests/scheduling/plugins/test_native.py`` checks both equal on randomized inputs. Learning a prompt
of 62 blocks none of which the index held, at capacity (every insert evicts), costs ~50-120 µs in Python and a few
µs in C (``picker bench schedule --learn``): with prompts that are new (a conversation's latest turn, a RAG
context) the Python cost would be the largest single part of a request picker routes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import xxhash

from picker.scheduling import native

__all__ = ["Index", "PrefixIndex", "PyPrefixIndex", "prefix_hashes", "py_match", "py_prefix_hashes"]

_xxh64 = xxhash.xxh64_intdigest


def py_prefix_hashes(text: str, block_bytes: int, max_blocks: int, model: str, salt: str = "") -> tuple[int, ...]:
    """The chained block hashes of ``text`` (empty when it is shorter than one block)."""
    data = text.encode()
    n = len(data)
    if n < block_bytes or block_bytes <= 0 or max_blocks <= 0:
        return ()
    limit = block_bytes * max_blocks
    if n > limit:
        data = data[:limit]
        n = limit
    prev = _xxh64((model + salt).encode())
    out: list[int] = []
    for start in range(0, n, block_bytes):
        prev = _xxh64(data[start : start + block_bytes] + prev.to_bytes(8, "little"))
        out.append(prev)
    return tuple(out)


def py_match(holders_of: dict[int, str | set[str]], hashes: Sequence[int]) -> dict[str, int]:
    """Endpoint key → blocks it holds, walking ``hashes`` until one that no endpoint holds."""
    counts: dict[str, int] = {}
    for h in hashes:
        holders = holders_of.get(h)
        if holders is None:
            break
        if type(holders) is str:
            counts[holders] = counts.get(holders, 0) + 1
        else:
            for key in holders:
                counts[key] = counts.get(key, 0) + 1
    return counts


class _Hasher(Protocol):
    def __call__(self, text: str, block_bytes: int, max_blocks: int, model: str, salt: str = "") -> tuple[int, ...]: ...


prefix_hashes: _Hasher
_match: Callable[[dict[int, str | set[str]], Sequence[int]], dict[str, int]]
if native.module is not None:
    prefix_hashes, _match = native.module.prefix_hashes, native.module.match
else:
    prefix_hashes, _match = py_prefix_hashes, py_match


class Index(Protocol):
    """What the prefix scorer uses of an index (``PyPrefixIndex`` and the native ``PrefixIndex``)."""

    @property
    def size(self) -> int: ...
    def endpoint_blocks(self, key: str) -> int: ...
    def match(self, hashes: Sequence[int]) -> dict[str, int]: ...
    def add(self, key: str, hashes: Sequence[int], capacity: int | None = None) -> int: ...
    def retain(self, keys: Iterable[str]) -> list[str]: ...


class PyPrefixIndex:
    """hash → endpoints holding it, with a per-endpoint LRU bound."""

    __slots__ = ("_capacity", "_holders", "_lru")

    def __init__(self, capacity_per_endpoint: int) -> None:
        self._capacity = capacity_per_endpoint
        self._holders: dict[int, str | set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}

    @property
    def size(self) -> int:
        """Distinct block hashes held by any endpoint."""
        return len(self._holders)

    def endpoint_blocks(self, key: str) -> int:
        lru = self._lru.get(key)
        return len(lru) if lru is not None else 0

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Endpoint key → blocks it holds, walking from the first hash until one that no endpoint holds."""
        return _match(self._holders, hashes)

    def add(self, key: str, hashes: Sequence[int], capacity: int | None = None) -> int:
        """Record that endpoint ``key`` now holds ``hashes``; evict its least recently used beyond capacity.
        Returns how many of the blocks it did not hold before."""
        if not hashes:
            return 0
        added = 0
        lru = self._lru.get(key)
        if lru is None:
            lru = self._lru[key] = OrderedDict()
        holders_of = self._holders
        for h in reversed(hashes):
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                added += 1
                holders = holders_of.get(h)
                if holders is None:
                    holders_of[h] = key
                elif isinstance(holders, str):
                    if holders != key:
                        holders_of[h] = {holders, key}
                else:
                    holders.add(key)
        limit = capacity if capacity and capacity > 0 else self._capacity
        while len(lru) > limit:
            old, _ = lru.popitem(last=False)
            self._drop(old, key)
        return added

    def retain(self, keys: Iterable[str]) -> list[str]:
        """Forget every endpoint not in ``keys``; returns the forgotten keys."""
        keep = set(keys)
        gone = [k for k in self._lru if k not in keep]
        for key in gone:
            for h in self._lru.pop(key):
                self._drop(h, key)
        return gone

    def _drop(self, h: int, key: str) -> None:
        holders = self._holders.get(h)
        if holders is None:
            return
        if isinstance(holders, str):
            if holders == key:
                del self._holders[h]
            return
        holders.discard(key)
        if len(holders) == 1:
            self._holders[h] = next(iter(holders))  # back to the untracked single-holder form
        elif not holders:
            del self._holders[h]


# The native index when the extension is in use (same results: tests/scheduling/plugins/test_native.py).
PrefixIndex: Callable[[int], Index] = native.module.PrefixIndex if native.module is not None else PyPrefixIndex
