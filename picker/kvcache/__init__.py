"""KV-cache state from the model servers' own events: block keys, the event wire format, the block index.

Pure values and data structures (no sockets, no clock); ``picker.kvevents`` is the I/O edge that feeds them.
"""

from picker.kvcache.events import (
    TOPIC_PREFIX,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    Limits,
    MalformedEvent,
    Topic,
    decode_batch,
    decode_sequence,
    parse_topic,
)
from picker.kvcache.index import DEFAULT_TIER_WEIGHTS, IndexStats, KVBlockIndex
from picker.kvcache.keys import block_keys, hash_seed_value, root_key

__all__ = [
    "DEFAULT_TIER_WEIGHTS",
    "TOPIC_PREFIX",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "IndexStats",
    "KVBlockIndex",
    "Limits",
    "MalformedEvent",
    "Topic",
    "block_keys",
    "decode_batch",
    "decode_sequence",
    "hash_seed_value",
    "parse_topic",
    "root_key",
]
