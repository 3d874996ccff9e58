"""The peer batch format: round trip, and every malformed input rejected with WireError (never anything else)."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import struct

import pytest

from picker.endpoints.model import EndpointMetrics
from picker.peers import wire
from picker.peers.wire import Batch, Placement, WireError
from picker.scrape.share import SharedScrape

METRICS = EndpointMetrics(
    waiting=3,
    running=7,
    kv_usage=0.625,
    running_loras=frozenset({"sql-lora", "chat-lora"}),
    waiting_loras=frozenset({"sql-lora"}),
    max_loras=4,
    block_size=16,
    num_gpu_blocks=2048,
    own_requests=5,
    generated_tokens=183402.0,
    prefix_query_tokens=912384.0,
    prefix_hit_tokens=0.0,
)


def sample() -> Batch:
    return Batch(
        incarnation=2**63 - 5,
        seq=42,
        full=True,
        loads={"10.0.0.1:8000": (3, 4096), "10.0.0.2:8000": (0, 0)},
        placements=(
            Placement("prefix-cache-scorer", "10.0.0.1:8000", 64, (1, 2**64 - 1, 3)),
            Placement("prefix-cache-scorer", "[fd00::1]:8000", 64, ()),
        ),
        scrapes=(
            SharedScrape("10.0.0.1:8000", 0.0125, METRICS),
            SharedScrape("10.0.0.2:8000", 0.0, EndpointMetrics()),  # None where a server tells nothing
            SharedScrape("10.0.0.3:8000", 0.5, None, "timeout", "no complete answer in 1.0 s"),
        ),
    )


def test_round_trip() -> None:
    batch = sample()
    data = wire.encode(batch)
    assert wire.decode(data) == batch
    # strings are sent once: the plugin name appears once although two placements use it
    assert data.count(b"prefix-cache-scorer") == 1


def test_a_batch_without_scrapes_has_no_scrapes_section() -> None:
    """Batches between replicas of other pods read as before the section existed (a rolling upgrade)."""
    without = dataclasses.replace(sample(), scrapes=())
    data = wire.encode(without)
    assert wire.decode(data) == without
    assert len(wire.encode(sample())) > len(data)
    # it ends with the last placement (strings 2 and 3, 64-byte blocks, no hashes): no section after it
    assert data.endswith(struct.pack("<HHIH", 2, 3, 64, 0))


def test_a_failure_message_is_cut_to_a_string_on_a_character_boundary() -> None:
    batch = Batch(1, 1, False, scrapes=(SharedScrape("k", 0.0, None, "http", "é" * 200),))
    [scrape] = wire.decode(wire.encode(batch)).scrapes
    assert scrape.message == "é" * (wire.MAX_STRING_BYTES // 2)


def test_loads_are_clamped_to_u32() -> None:
    data = wire.encode(Batch(1, 1, False, {"k": (-3, 2**40)}))
    assert wire.decode(data).loads == {"k": (0, 2**32 - 1)}


@pytest.mark.parametrize(
    "batch",
    [
        Batch(1, 1, False, placements=(Placement("p", "k", 64, tuple(range(wire.MAX_HASHES + 1))),)),
        Batch(1, 1, False, {"x" * (wire.MAX_STRING_BYTES + 1): (1, 1)}),
        Batch(1, 1, False, placements=(Placement("p", "k", 0, (1,)),)),
        Batch(1, 1, False, {f"k{i}": (1, 1) for i in range(wire.MAX_RECORDS + 1)}),
        Batch(1, 1, False, scrapes=(SharedScrape("k", 0.0, None, "no-such-reason", ""),)),
        Batch(
            1,
            1,
            False,
            scrapes=(
                SharedScrape(
                    "k", 0.0, EndpointMetrics(running_loras=frozenset(f"a{i}" for i in range(wire.MAX_LORAS + 1)))
                ),
            ),
        ),
    ],
)
def test_encode_refuses_over_limits(batch: Batch) -> None:
    with pytest.raises(WireError):
        wire.encode(batch)


def test_decode_rejects_bad_input() -> None:
    good = wire.encode(sample())
    bad = [
        b"",
        good[:10],
        b"XXXX" + good[4:],
        good + b"\0",
        good[:-1],
        b"\0" * (wire.MAX_BATCH_BYTES + 1),
    ]
    # a string count over the limit
    header = struct.pack("<4sQQB", wire.MAGIC, 1, 1, 0)
    bad.append(header + struct.pack("<H", wire.MAX_RECORDS + 1))
    # a load that references a string that does not exist
    bad.append(header + struct.pack("<H", 0) + struct.pack("<H", 1) + struct.pack("<HII", 5, 1, 1) + b"\0\0")
    # invalid UTF-8 in a string
    bad.append(header + struct.pack("<HH", 1, 2) + b"\xff\xfe" + b"\0\0\0\0")
    # a shared failure whose reason is not a scrape error reason
    strings = struct.pack("<H", 2) + struct.pack("<H", 1) + b"k" + struct.pack("<H", 4) + b"oops"
    bad.append(header + strings + b"\0\0" + b"\0\0" + struct.pack("<H", 1) + struct.pack("<HHIH", 0, 1, 0, 0))
    for data in bad:
        with pytest.raises(WireError):
            wire.decode(data)


def test_random_mutations_raise_only_wire_errors() -> None:
    good = wire.encode(sample())
    rng = random.Random(0)
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            del data[rng.randrange(len(data)) :]
        with contextlib.suppress(WireError):
            wire.decode(bytes(data))
