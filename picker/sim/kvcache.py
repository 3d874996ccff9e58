"""The KV-cache block pool with automatic prefix caching, as vLLM v1 manages it.

* A request's tokens fill fixed-size blocks. A *full* block gets a chained hash: ``h_i = xxh3_64(tokens of
  block i, seed=h_{i-1})``, the root seeded with the model (or LoRA adapter) name, so equal prefixes under the
  same adapter share hashes and different adapters never do.
* ``cached`` maps hash → block. A new request reuses the longest run of cached blocks from its start.
* Blocks are reference-counted. A block nobody references is *free* but keeps its contents (and hash) until it
  is reused: free blocks form an LRU queue, allocation takes the least recently freed one and only then
  forgets its hash. Never-used blocks come first.
* KV usage is ``1 - free / total`` (vLLM's definition: cached-but-unreferenced blocks count as free).
* With ``on_evict`` set, every hash that stops being findable because its block was reused is reported (the
  engine turns these into vLLM's ``BlockRemoved`` events); ``cache`` says whether a hash became findable.

Pure data structure: no clock, no I/O.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence

import xxhash

__all__ = ["BlockPool", "chain_hashes", "root_hash"]


def root_hash(namespace: str, seed: int = 0) -> int:
    """The parent of a sequence's first block: the model or adapter name under a hash seed."""
    return xxhash.xxh3_64_intdigest(namespace.encode(), seed=seed)


def chain_hashes(tokens: array[int], block_size: int, parent: int, start_block: int, end_block: int) -> list[int]:
    """Hashes of full blocks ``start_block..end_block-1`` of ``tokens``; ``parent`` is block start_block-1's."""
    out: list[int] = []
    for i in range(start_block, end_block):
        parent = xxhash.xxh3_64_intdigest(tokens[i * block_size : (i + 1) * block_size].tobytes(), seed=parent)
        out.append(parent)
    return out


class BlockPool:
    """``num_blocks`` KV blocks with reference counts, a hash → block map and an LRU free queue."""

    def __init__(
        self, num_blocks: int, *, enable_caching: bool = True, on_evict: Callable[[int], None] | None = None
    ) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.on_evict = on_evict
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}
        # Freed blocks in LRU order (front = evicted first). Blocks >= _fresh were never used and are not in it.
        self._free: OrderedDict[int, None] = OrderedDict()
        self._fresh = 0

    @property
    def num_free(self) -> int:
        return len(self._free) + (self.num_blocks - self._fresh)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks whose contents are findable by hash (referenced or not)."""
        return len(self._cached)

    def lookup(self, hashes: Sequence[int]) -> list[int]:
        """Blocks of the longest cached prefix of ``hashes`` (not touched: call ``touch`` to keep them)."""
        if not self.enable_caching:
            return []
        hit: list[int] = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            hit.append(block)
        return hit

    def evictable(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` sit in the free queue (touching them uses up free capacity)."""
        return sum(1 for b in blocks if self._ref[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """``n`` blocks with ref 1, or None (and nothing changed) when fewer than ``n`` are free."""
        if n > self.num_free:
            return None
        out: list[int] = []
        while len(out) < n:
            if self._fresh < self.num_blocks:
                b = self._fresh
                self._fresh += 1
            else:
                b, _ = self._free.popitem(last=False)
                h = self._hash[b]
                if h is not None:
                    self._hash[b] = None
                    if self._cached.get(h) == b:
                        del self._cached[h]
                        if self.on_evict is not None:
                            self.on_evict(h)
            self._ref[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference from each block; blocks reaching 0 join the free queue in the given order.

        Callers pass a request's blocks tail first, so its prefix (most likely shared) is evicted last.
        """
        for b in blocks:
            ref = self._ref[b] - 1
            if ref < 0:
                raise RuntimeError(f"block {b} released more often than taken")
            self._ref[b] = ref
            if ref == 0:
                self._free[b] = None

    def cache(self, block: int, block_hash: int) -> bool:
        """Make a full block findable by its hash (the first block with a hash keeps it); True if it is new."""
        if not self.enable_caching:
            return False
        self._hash[block] = block_hash
        return self._cached.setdefault(block_hash, block) == block

    def reset(self) -> None:
        """Forget all cached contents (only valid when no block is referenced)."""
        if any(self._ref):
            raise RuntimeError("reset with referenced blocks")
        self._hash = [None] * self.num_blocks
        self._cached.clear()
        self._free.clear()
        self._fresh = 0
