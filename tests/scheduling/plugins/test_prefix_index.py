"""The prefix index, both implementations (the Python one and the native one): shared holders, eviction, purge,
and no GC-tracked container per hash."""

from __future__ import annotations

import gc
from collections.abc import Callable

import pytest

from picker.scheduling import native
from picker.scheduling.plugins.prefix_index import Index, PyPrefixIndex

IMPLEMENTATIONS: list[Callable[[int], Index]] = [PyPrefixIndex]
if native.module is not None:
    IMPLEMENTATIONS.append(native.module.PrefixIndex)


@pytest.fixture(params=IMPLEMENTATIONS, ids=lambda impl: impl.__module__.rsplit(".", 1)[-1])
def make_index(request: pytest.FixtureRequest) -> Callable[[int], Index]:
    impl: Callable[[int], Index] = request.param
    return impl


def test_several_endpoints_share_a_hash_and_leave_it_one_by_one(make_index: Callable[[int], Index]) -> None:
    index = make_index(10)
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


def test_eviction_of_one_holder_keeps_the_hash_for_the_others(make_index: Callable[[int], Index]) -> None:
    index = make_index(2)
    index.add("a", [1, 2])
    index.add("b", [1, 2])
    index.add("a", [7, 8])  # evicts a's 1 and 2
    assert index.match([1, 2]) == {"b": 2}
    assert index.match([7, 8]) == {"a": 2}
    assert index.endpoint_blocks("a") == 2


def test_relearning_a_hash_by_its_only_holder_keeps_one_holder(make_index: Callable[[int], Index]) -> None:
    index = make_index(10)
    index.add("a", [1, 2])
    index.add("a", [1, 2])
    assert index.match([1, 2]) == {"a": 2}
    assert index.size == 2


def test_single_holders_create_no_gc_tracked_containers_per_hash(make_index: Callable[[int], Index]) -> None:
    index = make_index(100_000)
    gc.collect()
    before = len(gc.get_objects())
    for start in range(0, 50_000, 50):
        index.add("a", list(range(start, start + 50)))
    gc.collect()
    # The 50 000 hashes live in two dicts; no container per hash (a set each used to be 50 000 objects).
    assert len(gc.get_objects()) - before < 100
