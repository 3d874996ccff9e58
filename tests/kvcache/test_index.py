from picker.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored
from picker.kvcache.index import KVBlockIndex
from picker.kvcache.keys import block_keys, root_key

BS = 4
A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def tokens(n_blocks: int, start: int = 0) -> list[int]:
    return list(range(start, start + n_blocks * BS))


def stored(hashes: list[int], toks: list[int], parent: int | None = None, medium: str = "gpu") -> BlockStored:
    return BlockStored(tuple(hashes), parent, toks, BS, None, medium)


def keys_of(toks: list[int], name: str = "m") -> list[int]:
    return block_keys(toks, BS, root_key(name))


def test_engine_hashes_map_to_request_keys_from_tokens() -> None:
    idx = KVBlockIndex()
    t = tokens(4)
    # Engine hashes are arbitrary (a real server's own hash function): only the tokens name the blocks.
    idx.apply(A, "m", [stored([901, 902], t[:8]), stored([903, 904], t[8:], parent=902)])
    assert idx.match(keys_of(t), [A, B]) == {A: 4.0}
    assert idx.match(keys_of(t[:8]), [A]) == {A: 2.0}
    assert idx.match(keys_of(t, "other-model"), [A]) == {}
    assert idx.entries == 4
    assert idx.endpoint_blocks(A) == 4


def test_unknown_parent_is_dropped_and_counted() -> None:
    idx = KVBlockIndex()
    idx.apply(A, "m", [stored([5], tokens(1), parent=12345)])
    assert idx.entries == 0
    assert idx.stats.unknown_parent == 1


def test_longest_prefix_per_endpoint_with_tiers() -> None:
    idx = KVBlockIndex()
    t = tokens(3)
    idx.apply(A, "m", [stored([1, 2, 3], t)])
    idx.apply(B, "m", [stored([7], t[:4], medium="CPU".lower())])
    got = idx.match(keys_of(t), [A, B])
    assert got == {A: 3.0, B: 0.8}
    # a gap in A's run ends it there
    idx.apply(A, "m", [BlockRemoved((2,))])
    assert idx.match(keys_of(t), [A, B]) == {A: 1.0, B: 0.8}


def test_tier_update_without_tokens_and_removal_per_tier() -> None:
    idx = KVBlockIndex()
    t = tokens(2)
    idx.apply(A, "m", [stored([1, 2], t)])
    idx.apply(A, "m", [BlockStored((1, 2), None, [], BS, None, "cpu")])  # offloaded copies: no tokens
    idx.apply(A, "m", [BlockRemoved((1, 2), "gpu")])
    assert idx.match(keys_of(t), [A]) == {A: 1.6}  # still on CPU
    idx.apply(A, "m", [BlockRemoved((1, 2), "cpu")])
    assert idx.match(keys_of(t), [A]) == {}
    assert idx.entries == 0
    assert idx.keys == 0


def test_lora_name_roots_the_chain() -> None:
    idx = KVBlockIndex()
    t = tokens(2)
    idx.apply(A, "base", [BlockStored((1, 2), None, t, BS, "adapter-1")])
    assert idx.match(keys_of(t, "adapter-1"), [A]) == {A: 2.0}
    assert idx.match(keys_of(t, "base"), [A]) == {}


def test_all_blocks_cleared_and_endpoint_leaving() -> None:
    idx = KVBlockIndex()
    t = tokens(2)
    idx.apply(A, "m", [stored([1, 2], t)])
    idx.apply(B, "m", [stored([1, 2], t)])
    idx.apply(A, "m", [AllBlocksCleared()])
    assert idx.match(keys_of(t), [A, B]) == {B: 2.0}
    assert idx.retain([A]) == [B]
    assert idx.match(keys_of(t), [A, B]) == {}
    assert idx.entries == 0
    assert idx.keys == 0
    assert idx.endpoints() == [A]


def test_speculative_entries_expire_unless_confirmed() -> None:
    idx = KVBlockIndex()
    t = tokens(3)
    k = keys_of(t)
    assert idx.speculate(A, k, expires_at=10.0) == 3
    assert idx.match(k, [A]) == {A: 3.0}
    idx.apply(A, "m", [stored([1], t[:4])])  # the first block is confirmed
    assert idx.stats.speculative_confirmed == 1
    assert idx.expire(now=10.0) == 2
    assert idx.match(k, [A]) == {A: 1.0}
    assert idx.stats.speculative_expired == 2


def test_memory_bound_evicts_oldest_of_the_biggest() -> None:
    idx = KVBlockIndex(max_blocks=32)
    parent: int | None = None
    t = tokens(40)
    for i in range(40):
        idx.apply(A, "m", [stored([100 + i], t[i * BS : (i + 1) * BS], parent=parent)])
        parent = 100 + i
    assert idx.entries <= 32
    assert idx.stats.evicted >= 8
    assert idx.match(keys_of(t), [A]) == {}  # the oldest (first) blocks went first: the prefix is gone


def test_shared_prefix_many_holders() -> None:
    idx = KVBlockIndex()
    t = tokens(2)
    eps = [f"10.0.0.{i}:8000" for i in range(1, 21)]
    for ep in eps:
        idx.apply(ep, "m", [stored([1, 2], t)])
    assert idx.match(keys_of(t), eps) == {ep: 2.0 for ep in eps}
    for ep in eps[1:]:
        idx.apply(ep, "m", [BlockRemoved((1, 2))])
    assert idx.match(keys_of(t), eps) == {eps[0]: 2.0}
    assert idx.keys == 2
