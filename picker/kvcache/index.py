"""The KV-block index: which endpoint holds which prompt blocks, on which tier, from the servers' own events.

Two maps, as llm-d-kv-cache's "dual key" index (model-servers.md §4):

* per endpoint, *engine key* → *request key*: the server's block hash (from its events) → picker's key for the
  same block, computed from the event's ``token_ids`` (``keys.block_keys``; the parent's request key is the
  lookup of the event's ``parent_block_hash``, or the model / adapter root when it is nil). This map is also
  the endpoint's reverse index (what ``AllBlocksCleared`` or the endpoint's departure removes);
* request key → holders: the endpoint(s) holding the block and, per endpoint, a bit mask of tiers (``gpu``,
  ``cpu``, ... in the order of ``tier_weights``) plus a *speculative* bit.

Holders are stored compactly: a single holder (the common case) is one small int ``slot << 4 | mask`` (ints
< 257 are shared by CPython, so for the first 16 endpoints it costs nothing), several holders a dict
``slot → mask``. Measured size: ``picker bench kv-index`` (docs/performance.md).

Events:

* ``BlockStored``: request keys for as many blocks as the event has full blocks of tokens; each engine hash
  maps to its key and the endpoint gains the event's tier for it. Hashes past the tokens (an event with no or
  too few tokens: a tier update, e.g. CPU offload) add the tier to keys already known. Unknown parent ⇒ the
  event is dropped and counted (its chain cannot be named).
* ``BlockRemoved``: the tier is removed; a key with no tier left on that endpoint is forgotten.
* ``AllBlocksCleared``: the endpoint's entries are dropped.

Speculative entries (``speculate``): keys a router just sent to an endpoint, held under the speculative bit
until ``ttl_s`` passes (``expire``) or a ``BlockStored`` for the key confirms them (the bit is then cleared).

Bounded: at most ``max_blocks`` (engine key, endpoint) entries in all; past it the endpoint holding most loses
its oldest sixteenth (insertion order), counted in ``stats.evicted``. Pure: no clock (times are passed in),
no I/O.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from picker.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, Event
from picker.kvcache.keys import block_keys, root_key

__all__ = ["DEFAULT_TIER_WEIGHTS", "NATIVE", "IndexStats", "KVBlockIndex"]

DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8}
_SLOT_SHIFT = 4
_MASK = (1 << _SLOT_SHIFT) - 1
_SPEC = 1 << 3  # the speculative bit; bits 0..2 are tiers
_TIERS = _SPEC - 1
_MAX_TIERS = 3


def _load_native() -> (
    Callable[[Sequence[int], dict[int, int | dict[int, int]], dict[int, str], list[float]], dict[str, float]] | None
):
    """The C walk, or None when it is not built or ``PICKER_NATIVE`` is ``0`` (as picker.scheduling.native)."""
    if os.environ.get("PICKER_NATIVE", "1") == "0":
        return None
    try:
        from picker.kvcache import _native
    except ImportError:  # not built (no compiler at install): the Python walk
        return None
    return _native.match


_native_match = _load_native()
NATIVE = _native_match is not None


@dataclass(slots=True)
class IndexStats:
    """Counters since the index was made (exported as metrics; read by tests)."""

    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    unknown_parent: int = 0  # BlockStored events dropped: parent hash never seen on that endpoint
    unknown_removed: int = 0  # BlockRemoved hashes never seen
    unknown_tier: int = 0  # events for a medium with no configured weight
    evicted: int = 0  # entries dropped to stay within max_blocks
    speculative_added: int = 0
    speculative_confirmed: int = 0
    speculative_expired: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class KVBlockIndex:
    def __init__(
        self,
        *,
        max_blocks: int = 10_000_000,
        tier_weights: Mapping[str, float] = DEFAULT_TIER_WEIGHTS,
        hash_seed: int = 0,
        max_speculative: int = 1_000_000,
    ) -> None:
        if max_blocks < 1 or max_speculative < 0:
            raise ValueError("max_blocks >= 1 and max_speculative >= 0")
        if not 1 <= len(tier_weights) <= _MAX_TIERS:
            raise ValueError(f"1 to {_MAX_TIERS} tiers")
        self.max_blocks = max_blocks
        self.max_speculative = max_speculative
        self.hash_seed = hash_seed
        self.stats = IndexStats()
        self._tier_bit = {name.lower(): 1 << i for i, name in enumerate(tier_weights)}
        weights = {1 << i: float(w) for i, w in enumerate(tier_weights.values())}
        # Best weight of every mask (a block held on GPU and CPU counts as GPU); the speculative bit weighs as
        # the first tier (a block just sent there will be on the device).
        first = next(iter(weights.values()))
        self._weight = [
            max([w for bit, w in weights.items() if m & bit] + ([first] if m & _SPEC else []), default=0.0)
            for m in range(1 << _SLOT_SHIFT)
        ]
        self._slot_of: dict[str, int] = {}
        self._key_of: list[str | None] = []
        self._free_slots: list[int] = []
        self._engine: list[dict[int, int]] = []
        self._holders: dict[int, int | dict[int, int]] = {}
        self._entries = 0
        self._spec: deque[tuple[float, int, int]] = deque()
        self._roots: dict[str, int] = {}

    # -- reading ----------------------------------------------------------------------------------------------

    @property
    def entries(self) -> int:
        """(engine key, endpoint) entries held (what ``max_blocks`` bounds)."""
        return self._entries

    @property
    def keys(self) -> int:
        """Distinct request keys held by any endpoint (speculative ones included)."""
        return len(self._holders)

    def endpoints(self) -> list[str]:
        return [k for k in self._key_of if k is not None]

    def endpoint_blocks(self, endpoint: str) -> int:
        slot = self._slot_of.get(endpoint)
        return len(self._engine[slot]) if slot is not None else 0

    def root(self, name: str) -> int:
        """The root key of a model or adapter under this index's hash seed."""
        root = self._roots.get(name)
        if root is None:
            if len(self._roots) > 4096:
                self._roots.clear()
            root = self._roots[name] = root_key(name, self.hash_seed)
        return root

    def request_keys(
        self, tokens: Sequence[int], block_size: int, name: str, max_blocks: int | None = None
    ) -> list[int]:
        return block_keys(tokens, block_size, self.root(name), max_blocks)

    def match(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, float]:
        """Longest common prefix per endpoint, weighted by tier: endpoint → Σ tier weight over the leading keys
        it holds without a break (llm-d's ``LongestPrefix``). Endpoints holding nothing are absent. In C when the
        extension is built (``picker.kvcache._native``; ``match_python`` is its twin)."""
        wanted = self._wanted(endpoints) if keys else None
        if not wanted:
            return {}
        if _native_match is not None:
            return _native_match(keys, self._holders, wanted, self._weight)
        return self._match(keys, wanted)

    def match_python(self, keys: Sequence[int], endpoints: Iterable[str]) -> dict[str, float]:
        """``match`` in Python (what defines its result; the tests compare the two)."""
        wanted = self._wanted(endpoints) if keys else None
        return self._match(keys, wanted) if wanted else {}

    def _wanted(self, endpoints: Iterable[str]) -> dict[int, str]:
        """Slot → endpoint, for the endpoints the index knows."""
        slot_of = self._slot_of
        return {s: e for e in endpoints if (s := slot_of.get(e)) is not None}

    def _match(self, keys: Sequence[int], wanted: dict[int, str]) -> dict[str, float]:
        holders_of = self._holders
        weight = self._weight
        first = holders_of.get(keys[0])
        if first is None:
            return {}
        active: dict[int, float] = {}
        for slot, mask in _items(first):
            if slot in wanted and (w := weight[mask]) > 0.0:
                active[slot] = w
        done: dict[int, float] = {}
        for key in itertools.islice(keys, 1, None):
            if not active:
                break
            holders = holders_of.get(key)
            if holders is None:
                break
            if type(holders) is int:  # one holder (the common case): every other run ends here
                slot = holders >> _SLOT_SHIFT
                total = active.get(slot)
                w = weight[holders & _MASK]
                if total is None or w <= 0.0:
                    break
                if len(active) > 1:
                    for s, v in active.items():
                        if s != slot:
                            done[s] = v
                    active = {slot: total + w}
                else:
                    active[slot] = total + w
                continue
            assert isinstance(holders, dict)
            for slot in list(active):
                m = holders.get(slot)
                w = weight[m] if m is not None else 0.0
                if w > 0.0:
                    active[slot] += w
                else:  # its run ends here; the others go on
                    done[slot] = active.pop(slot)
        done.update(active)
        return {wanted[s]: v for s, v in done.items()}

    # -- events -----------------------------------------------------------------------------------------------

    def apply(self, endpoint: str, model: str, events: Iterable[Event]) -> None:
        """Apply one batch of ``endpoint``'s events in order (``model``: the topic's, the root of base blocks)."""
        slot = self._slot(endpoint)
        for event in events:
            if type(event) is BlockStored:
                self._stored(slot, model, event)
            elif type(event) is BlockRemoved:
                self._removed(slot, event)
            elif type(event) is AllBlocksCleared:
                self.stats.cleared += 1
                self._clear_slot(slot)

    def clear(self, endpoint: str) -> None:
        """Forget what ``endpoint`` holds (a resync: its state is unknown); speculative entries stay."""
        slot = self._slot_of.get(endpoint)
        if slot is not None:
            self._clear_slot(slot)

    def retain(self, endpoints: Iterable[str]) -> list[str]:
        """Drop every endpoint not in ``endpoints`` (left the pool), speculative entries included."""
        keep = set(endpoints)
        gone = [k for k in self._slot_of if k not in keep]
        for key in gone:
            slot = self._slot_of.pop(key)
            self._clear_slot(slot)
            self._drop_speculative(slot)
            self._key_of[slot] = None
            self._free_slots.append(slot)
        return gone

    def _stored(self, slot: int, model: str, ev: BlockStored) -> None:
        bit = self._tier_bit.get(ev.medium)
        if bit is None:
            self.stats.unknown_tier += 1
            return
        emap = self._engine[slot]
        if ev.parent_block_hash is None:
            parent = self.root(ev.lora_name or model)
        else:
            found = emap.get(ev.parent_block_hash)
            if found is None:
                self.stats.unknown_parent += 1
                return
            parent = found
        hashes = ev.block_hashes
        keys = block_keys(ev.token_ids, ev.block_size, parent, len(hashes)) if ev.token_ids else []
        add = self._add
        for engine_key, key in zip(hashes, keys, strict=False):
            old = emap.get(engine_key)
            if old is None:
                emap[engine_key] = key
                self._entries += 1
            elif old != key:  # the server reused a hash for other content: the old block is gone
                self._discard(slot, old, _MASK)
                emap[engine_key] = key
            add(slot, key, bit)
        # Hashes without tokens: a tier update of blocks already known.
        for engine_key in hashes[len(keys) :]:
            known = emap.get(engine_key)
            if known is not None:
                add(slot, known, bit)
        self.stats.stored_blocks += len(hashes)
        if self._entries > self.max_blocks:
            self._shrink()

    def _removed(self, slot: int, ev: BlockRemoved) -> None:
        bit = self._tier_bit.get(ev.medium)
        if bit is None:
            self.stats.unknown_tier += 1
            return
        emap = self._engine[slot]
        for engine_key in ev.block_hashes:
            key = emap.get(engine_key)
            if key is None:
                self.stats.unknown_removed += 1
                continue
            self.stats.removed_blocks += 1
            if not self._discard(slot, key, bit) & _TIERS:
                del emap[engine_key]
                self._entries -= 1

    # -- speculation ------------------------------------------------------------------------------------------

    def speculate(self, endpoint: str, keys: Sequence[int], expires_at: float) -> int:
        """Mark ``keys`` as (probably soon) held by ``endpoint`` until ``expires_at``; returns how many were new."""
        if not keys or self.max_speculative == 0:
            return 0
        slot = self._slot(endpoint)
        holders_of = self._holders
        added = 0
        for key in keys:
            holders = holders_of.get(key)
            if holders is not None and _mask_of(holders, slot):
                continue  # held (for real or already speculatively)
            self._add(slot, key, _SPEC)
            self._spec.append((expires_at, slot, key))
            added += 1
        self.stats.speculative_added += added
        while len(self._spec) > self.max_speculative:
            _, s, k = self._spec.popleft()
            self._expire_one(s, k)
        return added

    def expire(self, now: float) -> int:
        """Drop speculative entries whose time has passed; returns how many."""
        spec = self._spec
        n = 0
        while spec and spec[0][0] <= now:
            _, slot, key = spec.popleft()
            n += self._expire_one(slot, key)
        return n

    def _expire_one(self, slot: int, key: int) -> int:
        holders = self._holders.get(key)
        if holders is None or not _mask_of(holders, slot) & _SPEC:
            return 0  # confirmed (bit cleared) or gone
        self._discard(slot, key, _SPEC)
        self.stats.speculative_expired += 1
        return 1

    def _drop_speculative(self, slot: int) -> None:
        kept: deque[tuple[float, int, int]] = deque()
        for item in self._spec:
            if item[1] == slot:
                self._discard(slot, item[2], _SPEC)
            else:
                kept.append(item)
        self._spec = kept

    # -- holders ----------------------------------------------------------------------------------------------

    def _slot(self, endpoint: str) -> int:
        slot = self._slot_of.get(endpoint)
        if slot is None:
            if self._free_slots:
                slot = self._free_slots.pop()
                self._key_of[slot] = endpoint
                self._engine[slot] = {}
            else:
                slot = len(self._key_of)
                self._key_of.append(endpoint)
                self._engine.append({})
            self._slot_of[endpoint] = slot
        return slot

    def _add(self, slot: int, key: int, bit: int) -> None:
        """Give ``slot`` ``bit`` on ``key``; a real tier clears the speculative bit (confirmed)."""
        holders = self._holders.get(key)
        if holders is None:
            self._holders[key] = slot << _SLOT_SHIFT | bit
            return
        if type(holders) is int:
            if holders >> _SLOT_SHIFT == slot:
                self._holders[key] = self._merge(holders, bit)
            else:
                self._holders[key] = {holders >> _SLOT_SHIFT: holders & _MASK, slot: bit}
            return
        assert isinstance(holders, dict)
        old = holders.get(slot, 0)
        holders[slot] = self._merge(old, bit) & _MASK

    def _merge(self, old: int, bit: int) -> int:
        if bit != _SPEC and old & _SPEC:
            self.stats.speculative_confirmed += 1
            old &= ~_SPEC
        return old | bit

    def _discard(self, slot: int, key: int, bits: int) -> int:
        """Remove ``bits`` of ``slot`` on ``key``; returns the slot's mask left there."""
        holders = self._holders.get(key)
        if holders is None:
            return 0
        if type(holders) is int:
            if holders >> _SLOT_SHIFT != slot:
                return 0
            left = holders & _MASK & ~bits
            if left:
                self._holders[key] = slot << _SLOT_SHIFT | left
            else:
                del self._holders[key]
            return left
        assert isinstance(holders, dict)
        left = holders.get(slot, 0) & ~bits
        if left:
            holders[slot] = left
        else:
            holders.pop(slot, None)
            if len(holders) == 1:
                (s, m), *_ = holders.items()
                self._holders[key] = s << _SLOT_SHIFT | m
            elif not holders:
                del self._holders[key]
        return left

    def _clear_slot(self, slot: int) -> None:
        emap = self._engine[slot]
        discard = self._discard
        for key in emap.values():
            discard(slot, key, _TIERS)
        self._entries -= len(emap)
        self._engine[slot] = {}

    def _shrink(self) -> None:
        slot = max(range(len(self._engine)), key=lambda s: len(self._engine[s]))
        emap = self._engine[slot]
        victims = list(itertools.islice(emap.items(), max(1, len(emap) // 16)))
        for engine_key, key in victims:
            del emap[engine_key]
            self._discard(slot, key, _TIERS)
        self._entries -= len(victims)
        self.stats.evicted += len(victims)
        if len(emap) < 3 * len(victims):  # rebuild so the deleted front stops costing iteration time
            self._engine[slot] = dict(emap)


def _items(holders: int | dict[int, int]) -> Iterable[tuple[int, int]]:
    if type(holders) is int:
        return ((holders >> _SLOT_SHIFT, holders & _MASK),)
    assert isinstance(holders, dict)
    return holders.items()


def _mask_of(holders: int | dict[int, int], slot: int) -> int:
    if type(holders) is int:
        return holders & _MASK if holders >> _SLOT_SHIFT == slot else 0
    assert isinstance(holders, dict)
    return holders.get(slot, 0)
