"""The peer batch format: round trip, and every malformed input rejected with WireError (never anything else)."""

from __future__ import annotations

import contextlib
import random
import struct

import pytest

from picker.peers import wire
from picker.peers.wire import Batch, Placement, WireError


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
    )


def test_round_trip() -> None:
    batch = sample()
    data = wire.encode(batch)
    assert wire.decode(data) == batch
    # strings are sent once: the plugin name appears once although two placements use it
    assert data.count(b"prefix-cache-scorer") == 1


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
