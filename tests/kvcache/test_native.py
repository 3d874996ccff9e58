"""The C parts of the KV index (``picker.kvcache._native``) against their Python twins: ``KVBlockIndex.match``'s
walk on random indexes (the same endpoints, the same floats) and ``block_keys``' XXH3 chain (the same keys as the
``xxhash`` package)."""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from typing import overload

import pytest
import xxhash

from picker.kvcache import index as index_module
from picker.kvcache import keys as keys_module
from picker.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from picker.kvcache.index import KVBlockIndex
from picker.kvcache.keys import block_keys_python

# scripts/install.sh builds the extension (setup.py, gcc); a machine where it did not build fails here rather than
# skipping, as tests/scheduling/plugins/test_native.py does.
try:
    from picker.kvcache import _native
except ImportError as exc:  # pragma: no cover - an install problem, not a test outcome
    raise ImportError("picker.kvcache._native is not built: run scripts/install.sh with a C compiler") from exc

BS = 4


def random_index(rng: random.Random, tier_weights: dict[str, float]) -> tuple[KVBlockIndex, list[list[int]]]:
    idx = KVBlockIndex(tier_weights=tier_weights, max_blocks=rng.choice([50, 10_000]))
    chains = [[rng.randrange(1000) for _ in range(BS * rng.randint(1, 12))] for _ in range(6)]
    endpoints = [f"10.0.0.{i}:8000" for i in range(rng.randint(1, 20))]
    tiers = list(tier_weights)
    engine_hash = iter(range(1, 10**9))
    for _ in range(rng.randint(1, 60)):
        endpoint = rng.choice(endpoints)
        chain = rng.choice(chains)
        blocks = rng.randint(1, len(chain) // BS)
        hashes = [next(engine_hash) for _ in range(blocks)]
        events: list[Event] = [BlockStored(tuple(hashes), None, chain[: blocks * BS], BS, None, rng.choice(tiers))]
        if rng.random() < 0.3:  # a tier added without tokens (offload), or a tier or the whole set removed
            events.append(BlockStored(tuple(hashes[: rng.randint(1, blocks)]), None, [], BS, None, rng.choice(tiers)))
        if rng.random() < 0.3:
            events.append(BlockRemoved(tuple(rng.sample(hashes, rng.randint(1, blocks))), rng.choice(tiers)))
        if rng.random() < 0.03:
            events.append(AllBlocksCleared())
        idx.apply(endpoint, "m", events)
        if rng.random() < 0.2:
            keys = idx.request_keys(rng.choice(chains), BS, "m")
            idx.speculate(rng.choice(endpoints), keys[: rng.randint(1, len(keys))], expires_at=rng.random())
    if rng.random() < 0.3:
        idx.expire(0.5)
    return idx, chains


@pytest.mark.parametrize("tier_weights", [{"gpu": 1.0, "cpu": 0.8}, {"gpu": 1.0, "cpu": 0.0, "disk": 0.3}])
def test_the_c_walk_matches_the_python_walk(tier_weights: dict[str, float], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_module, "_native_match", _native.match)  # even under PICKER_NATIVE=0
    rng = random.Random(13)
    compared = nonempty = 0
    for _ in range(150):
        idx, chains = random_index(rng, tier_weights)
        known = idx.endpoints()
        for _ in range(20):
            chain = list(rng.choice(chains))
            if rng.random() < 0.3:  # diverge somewhere: the walk must stop there
                chain[rng.randrange(len(chain))] += 1
            keys = idx.request_keys(chain, BS, "m")
            wanted = rng.sample(known, rng.randint(0, len(known))) + ["10.9.9.9:8000"] * rng.randint(0, 1)
            got, want = idx.match(keys, wanted), idx.match_python(keys, wanted)
            assert got == want, (keys, wanted)
            assert list(map(type, got.values())) == [float] * len(got)
            compared += 1
            nonempty += bool(want)
    assert nonempty > compared // 4  # the cases exercise real runs, not only empty answers


def test_the_index_uses_the_c_walk_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (index_module._native_match is _native.match) == index_module.NATIVE
    monkeypatch.setenv("PICKER_NATIVE", "0")
    assert index_module._load_native() is None
    monkeypatch.setenv("PICKER_NATIVE", "1")
    assert index_module._load_native() is _native.match


def test_bad_arguments_raise_instead_of_crashing() -> None:
    with pytest.raises(ValueError, match="16 entries"):
        _native.match([1], {}, {}, [1.0])
    with pytest.raises(TypeError, match="int or a dict"):
        _native.match([1], {1: "x"}, {0: "a"}, [1.0] * 16)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="small non-negative"):
        _native.match([1], {}, {-1: "a"}, [1.0] * 16)


def test_the_c_xxh3_equals_the_xxhash_package_on_every_length() -> None:
    """Every length to 2 KiB and a few longer: each of XXH3's paths (0-16, 17-128, 129-240 bytes, and the long
    hash over one and more 1 KiB blocks), with seeds that matter (0, the top bit, all ones, random)."""
    rng = random.Random(5)
    for length in [*range(1, 2049), 4096, 5000, 16_384, 65_536 + 7]:
        data = rng.randbytes(length)
        for seed in (0, 1 << 63, (1 << 64) - 1, rng.getrandbits(64)):
            assert _native.block_keys(data, length, seed, 1) == [xxhash.xxh3_64_intdigest(data, seed=seed)], (
                length,
                seed,
            )


def test_the_c_chain_matches_the_python_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys_module, "_native_chains", (_native.block_keys, _native.token_keys))  # PICKER_NATIVE=0 too
    rng = random.Random(17)
    for _ in range(400):
        block_size = rng.choice([1, 2, 3, 4, 16, 17, 32, 33, 60, 61, 64, 128, 300])
        tokens = [rng.randrange(1 << 32) for _ in range(rng.randrange(block_size * 12))]
        parent = rng.getrandbits(64)
        max_blocks = rng.choice([None, 0, 1, rng.randrange(1, 20)])
        want = block_keys_python(tokens, block_size, parent, max_blocks)
        # a list and a tuple (a tokenizer's answer) are converted in C; an array('I') (the KV events' ids) is read
        # as its buffer; another sequence is copied into an array first
        for given in (tokens, tuple(tokens), array("I", tokens), PlainSequence(tokens)):
            assert keys_module.block_keys(given, block_size, parent, max_blocks) == want
        # an id of another integer type (numpy's) in a list: the C conversion declines, array('I') converts it
        mixed: list[int] = [TokenId(t) if i % 3 == 0 else t for i, t in enumerate(tokens)]  # type: ignore[misc]
        assert keys_module.block_keys(mixed, block_size, parent, max_blocks) == want
    for bad in ([1, -1], [1, 1 << 32], [1, 1.5], (1, "a"), PlainSequence([1, -1])):
        with pytest.raises(ValueError, match="token ids"):
            keys_module.block_keys(bad, 1, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size"):
        keys_module.block_keys([1], 0, 0)


def test_block_keys_use_the_c_chain_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (keys_module._native_chains == (_native.block_keys, _native.token_keys)) == keys_module.NATIVE
    monkeypatch.setenv("PICKER_NATIVE", "0")
    assert keys_module._load_native() is None
    monkeypatch.setenv("PICKER_NATIVE", "1")
    assert keys_module._load_native() == (_native.block_keys, _native.token_keys)


def test_the_c_chain_refuses_more_blocks_than_the_data_holds() -> None:
    with pytest.raises(ValueError, match="exceeds the data"):
        _native.block_keys(b"12345678", 4, 0, 3)
    with pytest.raises(ValueError, match="exceeds the data"):
        _native.block_keys(b"1234", 0, 0, 1)
    with pytest.raises(ValueError, match="exceeds the tokens"):
        _native.token_keys([1, 2, 3], 2, 0, 2)
    with pytest.raises(TypeError, match="list or a tuple"):
        _native.token_keys(range(4), 2, 0, 1)


class TokenId:
    """An integer type that is not ``int`` (as numpy's): usable where an index is."""

    def __init__(self, value: int) -> None:
        self._value = value

    def __index__(self) -> int:
        return self._value


class PlainSequence(Sequence[int]):
    """A sequence that is neither a list, a tuple nor an array."""

    def __init__(self, items: list[int]) -> None:
        self._items = items

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, i: int) -> int: ...

    @overload
    def __getitem__(self, i: slice) -> list[int]: ...

    def __getitem__(self, i: int | slice) -> int | list[int]:
        return self._items[i]
