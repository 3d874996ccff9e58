"""vLLM KV-cache events off the wire: topic, sequence number and msgpack batch → typed events.

A message is three ZeroMQ frames (model-servers.md §4):

* topic ``kv@<ip>:<port>@<model>`` (older servers: ``kv@<ip>@<model>``, no port);
* sequence: 8 bytes, big-endian uint64, counting the publisher's batches;
* payload: msgpack ``[ts, [event, ...], data_parallel_rank]``.

An event is either an array with its tag first (vLLM's encoding; trailing fields are optional, SGLang omits
them) or a map with a ``type`` key and named fields (vLLM's map encoding, SGLang):

* ``BlockStored``: ``block_hashes``, ``parent_block_hash`` (nil: the sequence's first block), ``token_ids``,
  ``block_size``, then optional ``lora_id``, ``medium``, ``lora_name``, ...;
* ``BlockRemoved``: ``block_hashes``, then optional ``medium``, ...;
* ``AllBlocksCleared``: nothing.

A block hash is an int or bytes (bytes: the last 8 as a big-endian uint64); ints are taken mod 2^64. ``medium``
is lower-cased, ``gpu`` when absent. Anything else is a ``MalformedEvent`` (a whole batch is rejected, so a
half-applied batch never exists). Every length is bounded (``Limits``) before anything is built: msgpack
refuses oversized strings, arrays and maps itself.

Pure: no sockets. The subscriber (``picker.kvevents``) feeds frames in; the index (``index.py``) applies events.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import msgpack

__all__ = [
    "DEFAULT_LIMITS",
    "TOPIC_PREFIX",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "Limits",
    "MalformedEvent",
    "Topic",
    "decode_batch",
    "decode_sequence",
    "parse_topic",
]

TOPIC_PREFIX = "kv@"
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_GPU = "gpu"


class MalformedEvent(ValueError):
    """A frame that is not a valid KV-event message; ``reason`` is a short, fixed label for metrics."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Limits:
    """Upper bounds on what one message may carry (a publisher is not trusted to be sane)."""

    max_payload_bytes: int = 4 * 1024 * 1024
    max_events: int = 4096  # events per batch
    max_hashes: int = 65536  # block hashes per event
    max_tokens: int = 1 << 20  # token ids per event
    max_name_chars: int = 1024  # topic, model, adapter, medium


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: Sequence[int]
    block_size: int
    lora_name: str | None = None
    medium: str = _GPU


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str = _GPU


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[Event, ...]
    dp_rank: int | None = None


class Topic(NamedTuple):
    address: str  # the publisher's IP (as written; IPv6 without brackets)
    port: int | None  # None: an old-style topic without a port
    model: str

    @property
    def endpoint_key(self) -> str | None:
        """``ip:port`` as picker keys endpoints (IPv6 bracketed); None without a port."""
        if self.port is None:
            return None
        return f"[{self.address}]:{self.port}" if ":" in self.address else f"{self.address}:{self.port}"


def parse_topic(frame: bytes, limits: Limits = DEFAULT_LIMITS) -> Topic:
    """``kv@<ip>:<port>@<model>`` (or ``kv@<ip>@<model>``); the model may itself contain ``@``."""
    if len(frame) > limits.max_name_chars:
        raise MalformedEvent("topic", "too long")
    try:
        text = frame.decode()
    except UnicodeDecodeError:
        raise MalformedEvent("topic", "not UTF-8") from None
    if not text.startswith(TOPIC_PREFIX):
        raise MalformedEvent("topic", "no kv@ prefix")
    host, sep, model = text[len(TOPIC_PREFIX) :].partition("@")
    if not sep or not host or not model:
        raise MalformedEvent("topic", "want kv@<ip>:<port>@<model>")
    address, port = host, None
    if host.startswith("["):  # [v6]:port
        close = host.find("]")
        if close < 0:
            raise MalformedEvent("topic", "unclosed [")
        address, rest = host[1:close], host[close + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise MalformedEvent("topic", "bad port")
            port = _port(rest[1:])
    elif host.count(":") == 1:
        address, _, port_text = host.partition(":")
        port = _port(port_text)
    if not address:
        raise MalformedEvent("topic", "no address")
    return Topic(address, port, model)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise MalformedEvent("topic", "bad port")
    return int(text)


def decode_sequence(frame: bytes) -> int:
    if len(frame) != 8:
        raise MalformedEvent("sequence", "want 8 bytes")
    return int.from_bytes(frame, "big")


def decode_batch(payload: bytes, limits: Limits = DEFAULT_LIMITS) -> EventBatch:
    """The batch in ``payload``; raises ``MalformedEvent``."""
    if len(payload) > limits.max_payload_bytes:
        raise MalformedEvent("size", f"{len(payload)} bytes")
    biggest = max(limits.max_events, limits.max_hashes, limits.max_tokens)
    try:
        doc = msgpack.unpackb(
            payload,
            raw=False,
            strict_map_key=True,
            use_list=True,
            max_str_len=limits.max_name_chars,
            max_bin_len=64,
            max_array_len=biggest,
            max_map_len=64,
            max_ext_len=0,
        )
    except (ValueError, TypeError, msgpack.UnpackException, msgpack.ExtraData, RecursionError) as exc:
        raise MalformedEvent("msgpack", type(exc).__name__) from None
    if not isinstance(doc, list) or not 2 <= len(doc) <= 3:
        raise MalformedEvent("batch", "want [ts, events, dp_rank]")
    ts, raw_events = doc[0], doc[1]
    dp_rank = doc[2] if len(doc) == 3 else None
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not math.isfinite(ts):
        raise MalformedEvent("batch", "ts")
    if dp_rank is not None and (isinstance(dp_rank, bool) or not isinstance(dp_rank, int)):
        raise MalformedEvent("batch", "data_parallel_rank")
    if not isinstance(raw_events, list) or len(raw_events) > limits.max_events:
        raise MalformedEvent("batch", "events")
    return EventBatch(float(ts), tuple(_event(e, limits) for e in raw_events), dp_rank)


_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
_REMOVED_FIELDS = ("block_hashes", "medium")


def _event(raw: Any, limits: Limits) -> Event:
    tag: Any
    if isinstance(raw, list):
        if not raw or not isinstance(raw[0], str):
            raise MalformedEvent("event", "no tag")
        tag, values = raw[0], raw[1:]
        if tag == "BlockStored":
            if len(values) < 4:
                raise MalformedEvent("event", "BlockStored needs 4 fields")
            fields: Mapping[str, Any] = dict(zip(_STORED_FIELDS, values, strict=False))
        elif tag == "BlockRemoved":
            if len(values) < 1:
                raise MalformedEvent("event", "BlockRemoved needs block_hashes")
            fields = dict(zip(_REMOVED_FIELDS, values, strict=False))
        else:
            fields = {}
    elif isinstance(raw, dict):
        tag = raw.get("type")
        fields = raw
    else:
        raise MalformedEvent("event", "not an array or a map")
    if tag == "BlockStored":
        if "block_hashes" not in fields or "token_ids" not in fields or "block_size" not in fields:
            raise MalformedEvent("event", "BlockStored fields missing")
        block_size = fields["block_size"]
        if isinstance(block_size, bool) or not isinstance(block_size, int) or not 0 < block_size <= 65536:
            raise MalformedEvent("event", "block_size")
        parent = fields.get("parent_block_hash")
        lora_name = fields.get("lora_name")
        if lora_name is not None and not isinstance(lora_name, str):
            raise MalformedEvent("event", "lora_name")
        return BlockStored(
            _hashes(fields["block_hashes"], limits),
            None if parent is None else _hash(parent),
            _tokens(fields["token_ids"], limits),
            block_size,
            lora_name or None,
            _medium(fields.get("medium")),
        )
    if tag == "BlockRemoved":
        if "block_hashes" not in fields:
            raise MalformedEvent("event", "BlockRemoved fields missing")
        return BlockRemoved(_hashes(fields["block_hashes"], limits), _medium(fields.get("medium")))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise MalformedEvent("event", "unknown tag")


def _hash(value: Any) -> int:
    if isinstance(value, bool):
        raise MalformedEvent("event", "block hash")
    if isinstance(value, int):
        return value & _U64
    if isinstance(value, bytes) and value:
        return int.from_bytes(value[-8:], "big")
    raise MalformedEvent("event", "block hash")


def _hashes(value: Any, limits: Limits) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > limits.max_hashes:
        raise MalformedEvent("event", "block_hashes")
    return tuple(_hash(v) for v in value)


def _tokens(value: Any, limits: Limits) -> Sequence[int]:
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > limits.max_tokens:
        raise MalformedEvent("event", "token_ids")
    # array('I') checks every id in C (an int in [0, 2^32)) and is what block_keys hashes: one pass, no copy.
    try:
        return array("I", value)
    except (TypeError, OverflowError):
        raise MalformedEvent("event", "token_ids") from None


def _medium(value: Any) -> str:
    if value is None:
        return _GPU
    if not isinstance(value, str) or not value:
        raise MalformedEvent("event", "medium")
    return value.lower()
