"""The peer exchange's batch format: one binary message, everything little-endian, every count bounded.

    header      b"PKX1"  incarnation u64  seq u64  flags u8 (bit 0: the loads are a full snapshot)
    strings     u16 n, then n x (u16 length, UTF-8 bytes ≤ MAX_STRING_BYTES)    endpoint keys and plugin names
    loads       u16 n, then n x (u16 key, u32 requests, u32 tokens)              the sender's in-flight totals
    placements  u16 n, then n x (u16 plugin, u16 key, u32 block bytes, u16 h, h x u64 hash)

Strings are referenced by index, so a key costs its bytes once per batch. ``decode`` checks the magic, every
count against the limits, every index against the string table, and that the message is consumed exactly; any
violation is a ``WireError`` (the receiver drops the batch: the next full snapshot and the re-announcements heal
what it carried).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "MAGIC",
    "MAX_BATCH_BYTES",
    "MAX_HASHES",
    "MAX_RECORDS",
    "MAX_STRING_BYTES",
    "Batch",
    "Placement",
    "WireError",
    "decode",
    "encode",
]

MAGIC = b"PKX1"
MAX_BATCH_BYTES = 256 * 1024
MAX_RECORDS = 4096  # strings, loads, placements: each
MAX_HASHES = 256  # per placement (the prefix scorer's default maxPrefixBlocksToMatch)
MAX_STRING_BYTES = 256
FLAG_FULL = 1

_HEADER = struct.Struct("<4sQQB")
_U16 = struct.Struct("<H")
_LOAD = struct.Struct("<HII")
_PLACEMENT = struct.Struct("<HHIH")
_U32_MAX = 0xFFFFFFFF


class WireError(ValueError):
    """A batch that is not one (wrong magic, over a limit, truncated, trailing bytes, bad reference)."""


@dataclass(frozen=True, slots=True)
class Placement:
    plugin: str  # the prefix plugin's name in the sender's config
    endpoint: str  # the server key (ip:port)
    block_bytes: int  # prompt bytes per block the hashes were cut with
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Batch:
    incarnation: int  # the sender's random id, new at every start
    seq: int  # the sender's batch counter to this receiver (gaps: batches lost)
    full: bool  # ``loads`` is a full snapshot (servers not named are at zero)
    loads: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (requests, tokens)
    placements: tuple[Placement, ...] = ()


def encode(batch: Batch) -> bytes:
    """The batch's bytes. Raises ``WireError`` if it cannot be sent within the limits (the caller splits)."""
    strings: dict[str, int] = {}

    def ref(s: str) -> int:
        i = strings.get(s)
        if i is None:
            if len(s.encode()) > MAX_STRING_BYTES:
                raise WireError(f"string over {MAX_STRING_BYTES} bytes")
            i = strings[s] = len(strings)
        return i

    loads = [(ref(k), _clamp(n), _clamp(t)) for k, (n, t) in batch.loads.items()]
    places = [(ref(p.plugin), ref(p.endpoint), p) for p in batch.placements]
    if max(len(strings), len(loads), len(places)) > MAX_RECORDS:
        raise WireError(f"over {MAX_RECORDS} records")
    out = [_HEADER.pack(MAGIC, batch.incarnation, batch.seq, FLAG_FULL if batch.full else 0), _U16.pack(len(strings))]
    for s in strings:
        raw = s.encode()
        out += (_U16.pack(len(raw)), raw)
    out.append(_U16.pack(len(loads)))
    out += (_LOAD.pack(*row) for row in loads)
    out.append(_U16.pack(len(places)))
    for plugin, key, p in places:
        if len(p.hashes) > MAX_HASHES or not 0 < p.block_bytes <= _U32_MAX:
            raise WireError("placement over the limits")
        n = len(p.hashes)
        out += (_PLACEMENT.pack(plugin, key, p.block_bytes, n), struct.pack(f"<{n}Q", *p.hashes))
    data = b"".join(out)
    if len(data) > MAX_BATCH_BYTES:
        raise WireError(f"batch of {len(data)} bytes over {MAX_BATCH_BYTES}")
    return data


def decode(data: bytes) -> Batch:
    if len(data) > MAX_BATCH_BYTES:
        raise WireError(f"batch of {len(data)} bytes over {MAX_BATCH_BYTES}")
    view = memoryview(data)
    pos = 0

    def take(st: struct.Struct) -> tuple[int, ...]:
        nonlocal pos
        if pos + st.size > len(view):
            raise WireError("truncated")
        values = st.unpack_from(view, pos)
        pos += st.size
        return values

    def count() -> int:
        (n,) = take(_U16)
        if n > MAX_RECORDS:
            raise WireError(f"over {MAX_RECORDS} records")
        return n

    if len(view) < _HEADER.size:
        raise WireError("truncated")
    magic, incarnation, seq, flags = _HEADER.unpack_from(view, 0)
    pos = _HEADER.size
    if magic != MAGIC:
        raise WireError("not a peer batch")
    strings: list[str] = []
    for _ in range(count()):
        (length,) = take(_U16)
        if length > MAX_STRING_BYTES or pos + length > len(view):
            raise WireError("bad string")
        try:
            strings.append(bytes(view[pos : pos + length]).decode())
        except UnicodeDecodeError as exc:
            raise WireError("bad string") from exc
        pos += length

    def string(i: int) -> str:
        if i >= len(strings):
            raise WireError("bad string reference")
        return strings[i]

    loads: dict[str, tuple[int, int]] = {}
    for _ in range(count()):
        key, n, t = take(_LOAD)
        loads[string(key)] = (n, t)
    placements: list[Placement] = []
    for _ in range(count()):
        plugin, key, block_bytes, h = take(_PLACEMENT)
        if h > MAX_HASHES or block_bytes == 0:
            raise WireError("placement over the limits")
        hashes = take(struct.Struct(f"<{h}Q")) if h else ()
        placements.append(Placement(string(plugin), string(key), block_bytes, hashes))
    if pos != len(view):
        raise WireError("trailing bytes")
    return Batch(incarnation, seq, bool(flags & FLAG_FULL), loads, tuple(placements))


def _clamp(n: int) -> int:
    return 0 if n < 0 else min(n, _U32_MAX)


def placements_bytes(placements: Sequence[Placement]) -> int:
    """What these placements add to a batch, strings aside (for splitting)."""
    return sum(_PLACEMENT.size + 8 * len(p.hashes) for p in placements)
