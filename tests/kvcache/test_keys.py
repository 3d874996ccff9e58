from array import array

import pytest

from picker.kvcache.keys import block_keys, hash_seed_value, root_key
from picker.sim.kvcache import chain_hashes, root_hash


def test_keys_equal_the_simulators_block_hashes() -> None:
    tokens = list(range(5000, 5100))
    root = root_key("m", 7)
    assert root == root_hash("m", 7)
    assert block_keys(tokens, 16, root) == chain_hashes(array("I", tokens), 16, root, 0, 6)


def test_partial_tail_dropped_and_prefix_property() -> None:
    root = root_key("m")
    a = block_keys(list(range(40)), 16, root)
    b = block_keys([*range(32), 999], 16, root)
    assert len(a) == 2
    assert a == b  # the same two full blocks; the tails differ but are not hashed
    assert block_keys(list(range(15)), 16, root) == []
    assert block_keys(list(range(64)), 16, root, max_blocks=3) == block_keys(list(range(48)), 16, root)


def test_model_adapter_seed_and_block_size_separate_keys() -> None:
    tokens = list(range(64))
    base = block_keys(tokens, 16, root_key("m"))
    assert block_keys(tokens, 16, root_key("lora-a")) != base
    assert block_keys(tokens, 16, root_key("m", 1)) != base
    assert set(block_keys(tokens, 32, root_key("m"))).isdisjoint(base)


def test_hash_seed_values() -> None:
    assert hash_seed_value("") == 0
    assert hash_seed_value("42") == 42 == hash_seed_value(42)
    assert hash_seed_value("abc") == hash_seed_value("abc") != 0


@pytest.mark.parametrize("bad", [[-1] * 16, [1 << 32] * 16])
def test_bad_token_ids(bad: list[int]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        block_keys(bad, 16, 0)
