"""The block pool: chained hashes, longest-prefix lookup, reference counts, LRU eviction of free blocks."""

from __future__ import annotations

from array import array

import pytest

from picker.sim.kvcache import BlockPool, chain_hashes, root_hash


def hashes(tokens: list[int], ns: str = "m", bs: int = 4) -> list[int]:
    return chain_hashes(array("I", tokens), bs, root_hash(ns), 0, len(tokens) // bs)


def test_chained_hashes_share_exactly_the_common_prefix() -> None:
    a = hashes([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    b = hashes([1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0])
    c = hashes([0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    assert not set(a) & set(c)  # a different first block changes every later hash
    assert hashes([1, 2, 3, 4], ns="lora-x") != hashes([1, 2, 3, 4])
    assert len(hashes([1, 2, 3, 4, 5])) == 1  # partial tail block has no hash


def test_chain_continues_from_a_parent() -> None:
    toks = array("I", range(12))
    full = chain_hashes(toks, 4, 7, 0, 3)
    assert chain_hashes(toks, 4, full[0], 1, 3) == full[1:]


def test_allocate_release_and_usage() -> None:
    pool = BlockPool(4)
    got = pool.allocate(3)
    assert got == [0, 1, 2]
    assert pool.usage == pytest.approx(0.75)
    assert pool.allocate(2) is None  # nothing changed
    assert pool.num_free == 1
    pool.release(got)
    assert pool.num_free == 4
    assert pool.usage == 0.0
    with pytest.raises(RuntimeError):
        pool.release([0])


def test_cached_free_blocks_are_found_until_evicted_lru_first() -> None:
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    assert blocks is not None
    for b, h in zip(blocks, (100, 101, 102), strict=True):
        pool.cache(b, h)
    pool.release([2, 1, 0])  # tail first, as the engine does: block 0 (the prefix) is evicted last
    assert pool.lookup([100, 101, 102]) == [0, 1, 2]
    new = pool.allocate(1)
    assert new == [2]
    assert pool.lookup([100, 101, 102]) == [0, 1]
    pool.touch([0])  # a hit takes block 0 off the free queue
    assert pool.num_free == 1
    assert pool.evictable([0, 1]) == 1
    assert pool.allocate(1) == [1]
    assert pool.lookup([100, 101]) == [0]


def test_lookup_stops_at_the_first_miss() -> None:
    pool = BlockPool(4)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.cache(blocks[0], 1)
    pool.cache(blocks[1], 3)
    assert pool.lookup([1, 2, 3]) == [blocks[0]]


def test_duplicate_hash_keeps_the_first_block() -> None:
    pool = BlockPool(2)
    a, b = pool.allocate(2) or []
    pool.cache(a, 9)
    pool.cache(b, 9)
    pool.release([b])
    assert pool.allocate(1) == [b]  # evicting b must not forget a's entry
    assert pool.lookup([9]) == [a]


def test_caching_disabled() -> None:
    pool = BlockPool(2, enable_caching=False)
    [a] = pool.allocate(1) or []
    pool.cache(a, 5)
    assert pool.lookup([5]) == []


def test_reset_requires_no_references() -> None:
    pool = BlockPool(2)
    blocks = pool.allocate(1)
    assert blocks is not None
    with pytest.raises(RuntimeError):
        pool.reset()
    pool.release(blocks)
    pool.reset()
    assert pool.num_free == 2
