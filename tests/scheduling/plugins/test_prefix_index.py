"""PrefixIndex internals: shared holders, eviction, purge, and the GC-friendly single-holder form."""

from __future__ import annotations

import gc

from picker.scheduling.plugins.prefix_index import PrefixIndex


def test_several_endpoints_share_a_hash_and_leave_it_one_by_one() -> None:
    index = PrefixIndex(capacity_per_endpoint=10)
    index.add("a", [1, 2, 3])
    index.add("b", [1, 2])
    index.add("c", [1])
    assert index.match([1, 2, 3]) == {"a": 3, "b": 2, "c": 1}
    index.retain(["a", "c"])
    assert index.match([1, 2, 3]) == {"a": 3, "c": 1}
    index.retain(["c"])
    assert index.match([1, 2, 3]) == {"c": 1}
    assert index.size == 1
    index.retain([])
    assert index.size == 0
    assert index.match([1]) == {}


def test_eviction_of_one_holder_keeps_the_hash_for_the_others() -> None:
    index = PrefixIndex(capacity_per_endpoint=2)
    index.add("a", [1, 2])
    index.add("b", [1, 2])
    index.add("a", [7, 8])  # evicts a's 1 and 2
    assert index.match([1, 2]) == {"b": 2}
    assert index.match([7, 8]) == {"a": 2}
    assert index.endpoint_blocks("a") == 2


def test_relearning_a_hash_by_its_only_holder_keeps_one_holder() -> None:
    index = PrefixIndex(capacity_per_endpoint=10)
    index.add("a", [1, 2])
    index.add("a", [1, 2])
    assert index.match([1, 2]) == {"a": 2}
    assert index.size == 2


def test_single_holders_create_no_gc_tracked_containers_per_hash() -> None:
    index = PrefixIndex(capacity_per_endpoint=100_000)
    gc.collect()
    before = len(gc.get_objects())
    for start in range(0, 50_000, 50):
        index.add("a", list(range(start, start + 50)))
    gc.collect()
    # The 50 000 hashes live in two dicts; no container per hash (a set each used to be 50 000 objects).
    assert len(gc.get_objects()) - before < 100
