"""The peer exchange's batch format: one binary message, everything little-endian, every count bounded.

    header      b"PKX1"  incarnation u64  seq u64  flags u8 (bit 0: the loads are a full snapshot)
    strings     u16 n, then n x (u16 length, UTF-8 bytes ≤ MAX_STRING_BYTES)    endpoint keys and plugin names
    loads       u16 n, then n x (u16 key, u32 requests, u32 tokens)              the sender's in-flight totals
    placements  u16 n, then n x (u16 plugin, u16 key, u32 block bytes, u16 h, h x u64 hash)
    scrapes     (only when there are any) u16 n, then n x a shared poll outcome (picker.scrape.share):
                u16 key, u16 reason (a string; 0xFFFF: the poll succeeded), u32 age in µs, then
                succeeded: u32 waiting, u32 running, f64 KV use, u32 max LoRAs, i64 block size, i64 GPU blocks,
                           i64 own requests (-1: None each), f64 tokens generated, f64 prefix-cache query tokens,
                           f64 prefix-cache hit tokens (NaN: None each), u16 r, r x u16 running LoRA, u16 w,
                           w x u16 waiting LoRA
                failed:    u16 message (a string)

Strings are referenced by index, so a key costs its bytes once per batch. ``decode`` checks the magic, every
count against the limits, every index against the string table, and that the message is consumed exactly; any
violation is a ``WireError`` (the receiver drops the batch: the next full snapshot and the re-announcements heal
what it carried).

The scrapes section is left out when empty, so a batch without it reads as before this section existed: only the
workers of one pod, which run the same build, share scrapes.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from picker.endpoints.model import EndpointMetrics
from picker.scrape.errors import REASONS
from picker.scrape.share import SharedScrape

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
MAX_RECORDS = 4096  # strings, loads, placements, scrapes: each
MAX_HASHES = 256  # per placement (the prefix scorer's default maxPrefixBlocksToMatch)
MAX_STRING_BYTES = 256
MAX_LORAS = 256  # per list of a shared scrape
FLAG_FULL = 1

_HEADER = struct.Struct("<4sQQB")
_U16 = struct.Struct("<H")
_LOAD = struct.Struct("<HII")
_PLACEMENT = struct.Struct("<HHIH")
_SCRAPE = struct.Struct("<HHI")
_SCRAPE_METRICS = struct.Struct("<IIdIqqqddd")
_OK = 0xFFFF
_U32_MAX = 0xFFFFFFFF
_I64_MAX = 2**63 - 1


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
    scrapes: tuple[SharedScrape, ...] = ()  # only between the workers of one pod


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
    scrapes = [_encode_scrape(s, ref) for s in batch.scrapes]
    if max(len(strings), len(loads), len(places), len(scrapes)) > MAX_RECORDS:
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
    if scrapes:
        out.append(_U16.pack(len(scrapes)))
        out += scrapes
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
    scrapes: list[SharedScrape] = []
    if pos < len(view):
        for _ in range(count()):
            key, reason, age_us = take(_SCRAPE)
            if reason != _OK:
                reason_s = string(reason)
                if reason_s not in REASONS:
                    raise WireError("unknown scrape error reason")
                (message,) = take(_U16)
                scrapes.append(SharedScrape(string(key), age_us / 1e6, None, reason_s, string(message)))
                continue
            waiting, running, kv, max_loras, block_size, gpu_blocks, own, *counters = take(_SCRAPE_METRICS)
            loras = []
            for _ in range(2):
                (n,) = take(_U16)
                if n > MAX_LORAS:
                    raise WireError("over the LoRA limit")
                loras.append(frozenset(string(i) for i in take(struct.Struct(f"<{n}H"))) if n else frozenset())
            metrics = EndpointMetrics(
                waiting=waiting,
                running=running,
                kv_usage=kv,
                running_loras=loras[0],
                waiting_loras=loras[1],
                max_loras=max_loras,
                block_size=_optional(block_size),
                num_gpu_blocks=_optional(gpu_blocks),
                own_requests=_optional(own),
                generated_tokens=_counter(counters[0]),
                prefix_query_tokens=_counter(counters[1]),
                prefix_hit_tokens=_counter(counters[2]),
            )
            scrapes.append(SharedScrape(string(key), age_us / 1e6, metrics))
    if pos != len(view):
        raise WireError("trailing bytes")
    return Batch(incarnation, seq, bool(flags & FLAG_FULL), loads, tuple(placements), tuple(scrapes))


def _encode_scrape(s: SharedScrape, ref: Callable[[str], int]) -> bytes:
    age_us = min(_U32_MAX, max(0, round(s.age_s * 1e6)))
    m = s.metrics
    if m is None:
        if s.reason not in REASONS:
            raise WireError("unknown scrape error reason")
        message = s.message.encode()[:MAX_STRING_BYTES].decode(errors="ignore")
        return _SCRAPE.pack(ref(s.key), ref(s.reason), age_us) + _U16.pack(ref(message))
    if max(len(m.running_loras), len(m.waiting_loras)) > MAX_LORAS:
        raise WireError("over the LoRA limit")
    parts = [
        _SCRAPE.pack(ref(s.key), _OK, age_us),
        _SCRAPE_METRICS.pack(
            _clamp(m.waiting),
            _clamp(m.running),
            m.kv_usage,
            _clamp(m.max_loras),
            _nullable(m.block_size),
            _nullable(m.num_gpu_blocks),
            _nullable(m.own_requests),
            *(math.nan if c is None else c for c in (m.generated_tokens, m.prefix_query_tokens, m.prefix_hit_tokens)),
        ),
    ]
    for names in (m.running_loras, m.waiting_loras):
        parts.append(_U16.pack(len(names)))
        parts += (_U16.pack(ref(n)) for n in sorted(names))
    return b"".join(parts)


def _nullable(n: int | None) -> int:
    return -1 if n is None else max(0, min(n, _I64_MAX))


def _optional(n: int) -> int | None:
    return None if n < 0 else n


def _counter(x: float) -> float | None:
    return x if math.isfinite(x) and x >= 0.0 else None


def _clamp(n: int) -> int:
    return 0 if n < 0 else min(n, _U32_MAX)


def placements_bytes(placements: Sequence[Placement]) -> int:
    """What these placements add to a batch, strings aside (for splitting)."""
    return sum(_PLACEMENT.size + 8 * len(p.hashes) for p in placements)
