import contextlib
from array import array

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picker.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Limits,
    MalformedEvent,
    decode_batch,
    decode_sequence,
    parse_topic,
)


def pack(events: list[object], ts: float = 1.5, rank: int | None = 0) -> bytes:
    return msgpack.packb([ts, events, rank])


def test_array_encoding_all_tags() -> None:
    stored = ["BlockStored", [1, b"\x00" * 24 + (5).to_bytes(8, "big")], None, list(range(32)), 16, None, "GPU", None]
    batch = decode_batch(pack([stored, ["BlockRemoved", [1], "CPU"], ["AllBlocksCleared"]]))
    assert batch.ts == 1.5
    assert batch.dp_rank == 0
    first, second, third = batch.events
    assert first == BlockStored((1, 5), None, array("I", range(32)), 16, None, "gpu")
    assert second == BlockRemoved((1,), "cpu")
    assert third == AllBlocksCleared()


def test_short_array_events_as_sglang_sends_them() -> None:
    batch = decode_batch(pack([["BlockStored", [7], 3, [1] * 16, 16], ["BlockRemoved", [7]]], rank=None))
    assert batch.events == (BlockStored((7,), 3, array("I", [1] * 16), 16), BlockRemoved((7,)))
    assert batch.dp_rank is None


def test_map_encoding() -> None:
    events = [
        {
            "type": "BlockStored",
            "block_hashes": [-1],
            "parent_block_hash": None,
            "token_ids": [4] * 16,
            "block_size": 16,
            "lora_name": "ad",
            "medium": "cpu",
        },
        {"type": "BlockRemoved", "block_hashes": [9], "medium": None},
        {"type": "AllBlocksCleared"},
    ]
    batch = decode_batch(pack(events))
    assert batch.events[0] == BlockStored((2**64 - 1,), None, array("I", [4] * 16), 16, "ad", "cpu")
    assert batch.events[1] == BlockRemoved((9,), "gpu")
    assert batch.events[2] == AllBlocksCleared()


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",
        msgpack.packb({"ts": 1}),
        msgpack.packb([1.0]),
        msgpack.packb(["x", []]),
        msgpack.packb([float("nan"), []]),
        msgpack.packb([1.0, [], "rank"]),
        pack([["Nope"]]),
        pack([["BlockStored", [1], None]]),
        pack([["BlockStored", [1], None, [1.5], 16]]),
        pack([["BlockStored", [1], None, [1], 0]]),
        pack([["BlockStored", [True], None, [1], 16]]),
        pack([["BlockStored", [1], None, [-3], 16]]),
        pack([["BlockRemoved"]]),
        pack([{"type": "BlockRemoved"}]),
        pack([42]),
    ],
)
def test_malformed_batches_are_rejected(payload: bytes) -> None:
    with pytest.raises(MalformedEvent):
        decode_batch(payload)


def test_limits_bound_everything() -> None:
    limits = Limits(max_events=2, max_hashes=4, max_tokens=8, max_payload_bytes=200)
    with pytest.raises(MalformedEvent):
        decode_batch(pack([["AllBlocksCleared"]] * 3), limits)
    with pytest.raises(MalformedEvent):
        decode_batch(pack([["BlockRemoved", list(range(5))]]), limits)
    with pytest.raises(MalformedEvent):
        decode_batch(pack([["BlockStored", [1], None, list(range(9)), 1]]), limits)
    with pytest.raises(MalformedEvent, match="size"):
        decode_batch(b"\x90" * 201, limits)


def test_topics() -> None:
    t = parse_topic(b"kv@10.0.0.1:8000@meta/llama@v2")
    assert (t.address, t.port, t.model, t.endpoint_key) == ("10.0.0.1", 8000, "meta/llama@v2", "10.0.0.1:8000")
    old = parse_topic(b"kv@10.0.0.1@m")
    assert old.port is None
    assert old.endpoint_key is None
    v6 = parse_topic(b"kv@[fd00::1]:8000@m")
    assert v6.endpoint_key == "[fd00::1]:8000"
    bad_topics = (b"kv@", b"xx@1.2.3.4:1@m", b"kv@1.2.3.4:0@m", b"kv@1.2.3.4:x@m", b"kv@1.2.3.4:1@")
    bad_topics += (b"\xff", b"kv@[::1@m")
    for bad in bad_topics:
        with pytest.raises(MalformedEvent):
            parse_topic(bad)


def test_sequence_frames() -> None:
    assert decode_sequence((258).to_bytes(8, "big")) == 258
    with pytest.raises(MalformedEvent):
        decode_sequence(b"\x00" * 4)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_never_crash(payload: bytes) -> None:
    with contextlib.suppress(MalformedEvent):
        decode_batch(payload)


_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=8),
                  st.binary(max_size=12))  # fmt: skip
_doc = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner,
                    max_size=4), max_leaves=30)  # fmt: skip
_tag = st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_doc, st.tuples(_tag, st.lists(_doc, max_size=8)).map(lambda t: [t[0], *t[1]])), max_size=4))
def test_fuzz_structured_events_never_crash(events: list[object]) -> None:
    with contextlib.suppress(MalformedEvent):
        decode_batch(pack(events))
