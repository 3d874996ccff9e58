"""``picker bench kv-index``: the KV-block index's memory per block and the KV-event ingest rate on one core.

Memory: ``--blocks`` (default 1 000 000) blocks stored through real ``BlockStored`` events into one
``KVBlockIndex``, spread over ``--endpoints`` servers as chains of ``--chain`` blocks, a ``--shared`` share of
the chains held by two servers (a popular prefix); ``tracemalloc`` measures what the index holds afterwards.

Ingest: vLLM-shaped traffic as the subscriber receives it — three-frame messages of ``--batch`` events each,
msgpack-encoded in advance — fed through ``Ingestor.receive`` (topic and sequence checks, msgpack decoding,
validation, request keys from token ids, index updates) in one thread. The event mix is a full cache in
steady state: every stored block is later removed; ``--blocks-per-event`` blocks per ``BlockStored`` (1: one
decode step's block, the worst case per event). Reported: events/s and blocks/s of CPU time and wall time.

Also the lookup a scheduling cycle does: the prompt's block keys (the C chain of ``picker.kvcache._native``, when
built, and the Python one), then the longest-prefix match of a 4 000-token prompt over 1, 4, 16 and
``--endpoints`` servers holding growing shares of it, with the C walk and the Python one. ``--lookup-only`` skips
memory and ingest.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
import tracemalloc
from collections.abc import Sequence

import msgpack

from picker.kvcache import keys as keys_module
from picker.kvcache.events import BlockStored
from picker.kvcache.index import NATIVE, KVBlockIndex
from picker.kvcache.ingest import Ingestor
from picker.kvcache.keys import block_keys, block_keys_python, root_key
from picker.scheduling import units

__all__ = ["configure", "ingest_rate", "keys_us", "lookup_us", "memory", "run"]

BLOCK = 16
MODEL = "bench-model"
PROMPT_TOKENS = 4000  # the lookup's prompt


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--blocks", type=units.at_least(1), default=1_000_000, help="blocks in the memory test (default 1e6)"
    )
    parser.add_argument("--endpoints", type=units.at_least(1), default=16)
    parser.add_argument("--chain", type=units.at_least(1), default=64, help="blocks per stored sequence (default 64)")
    parser.add_argument("--shared", type=units.fraction, default=0.1, help="share of sequences held by two servers")
    parser.add_argument(
        "--events", type=units.at_least(1), default=300_000, help="events in the ingest test (default 3e5)"
    )
    parser.add_argument("--batch", type=units.at_least(1), default=16, help="events per message (vLLM sim default 16)")
    parser.add_argument(
        "--blocks-per-event", type=units.at_least(1), default=1, help="blocks per BlockStored (default 1)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lookup-only", action="store_true", help="only the lookup times")


def _endpoint(i: int) -> str:
    return f"10.0.{i // 250}.{i % 250 + 1}:8000"


def memory(blocks: int, endpoints: int, chain: int, shared: float, seed: int = 0) -> dict[str, float]:
    """Bytes the index holds for ``blocks`` (block, endpoint) entries."""
    rng = random.Random(seed)
    eps = [_endpoint(i) for i in range(endpoints)]
    gc.collect()
    tracemalloc.start()
    index = KVBlockIndex(max_blocks=blocks * 2)
    base = tracemalloc.get_traced_memory()[0]
    stored = 0
    seq = 0
    while stored < blocks:
        n = min(chain, blocks - stored)
        tokens = [rng.randrange(50_000) for _ in range(n * BLOCK)]
        holders = [rng.randrange(endpoints)]
        if rng.random() < shared and endpoints > 1 and stored + 2 * n <= blocks:
            holders.append((holders[0] + 1) % endpoints)
        for h in holders:
            engine_hashes = tuple(rng.getrandbits(64) for _ in range(n))
            index.apply(eps[h], MODEL, [_stored(engine_hashes, None, tokens)])
            stored += n
        seq += 1
    used = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    entries = index.entries
    return {
        "entries": entries,
        "keys": index.keys,
        "bytes": used,
        "bytes_per_entry": used / entries,
        "entries_per_mib": entries / (used / 2**20),
        "mib_per_million": used / 2**20 / (entries / 1e6),
    }


def _stored(hashes: Sequence[int], parent: int | None, tokens: list[int]) -> BlockStored:
    return BlockStored(tuple(hashes), parent, tokens, BLOCK)


def _messages(events: int, batch: int, per_event: int, endpoints: int, seed: int) -> list[list[bytes]]:
    """Pre-encoded messages: per endpoint, sequences stored block by block, then removed (a cache in steady
    state), interleaved across endpoints."""
    rng = random.Random(seed)
    eps = [_endpoint(i) for i in range(endpoints)]
    topics = [f"kv@{e}@{MODEL}".encode() for e in eps]
    seqs = [0] * endpoints
    live: list[list[int]] = [[] for _ in range(endpoints)]  # engine hashes stored, oldest first
    parent: list[int | None] = [None] * endpoints
    out: list[list[bytes]] = []
    made = 0
    while made < events:
        e = rng.randrange(endpoints)
        batch_events: list[object] = []
        for _ in range(batch):
            if len(live[e]) > 2048:  # full: evict the oldest ones
                gone, live[e] = live[e][:per_event], live[e][per_event:]
                batch_events.append(["BlockRemoved", gone, "GPU"])
            else:
                if rng.random() < 0.05:
                    parent[e] = None  # a new sequence
                hashes = [rng.getrandbits(63) for _ in range(per_event)]
                tokens = [rng.randrange(50_000) for _ in range(per_event * BLOCK)]
                batch_events.append(["BlockStored", hashes, parent[e], tokens, BLOCK, None, "GPU", None])
                parent[e] = hashes[-1]
                live[e].extend(hashes)
            made += 1
        out.append([topics[e], seqs[e].to_bytes(8, "big"), msgpack.packb([time.time(), batch_events, None])])
        seqs[e] += 1
    return out


def ingest_rate(events: int, batch: int, per_event: int, endpoints: int, seed: int = 0) -> dict[str, float]:
    messages = _messages(events, batch, per_event, endpoints, seed)
    index = KVBlockIndex()
    ingestor = Ingestor([index])
    ingestor.set_endpoints(_endpoint(i) for i in range(endpoints))
    gc.collect()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for frames in messages:
        ingestor.receive(frames)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    n_events = ingestor.stats.events
    blocks = index.stats.stored_blocks + index.stats.removed_blocks
    return {
        "messages": len(messages),
        "events": n_events,
        "blocks": blocks,
        "events_per_s_cpu": n_events / cpu,
        "events_per_s_wall": n_events / wall,
        "blocks_per_s_cpu": blocks / cpu,
        "unknown_parent": index.stats.unknown_parent,
        "entries": index.entries,
    }


def keys_us(prompt_tokens: int = PROMPT_TOKENS, rounds: int = 2000, *, python: bool = False) -> float:
    """µs to key a prompt's blocks (token ids in a list, as a tokenizer returns them); ``python``: the Python
    chain even when the C one is built."""
    rng = random.Random(1)
    tokens = [rng.randrange(50_000) for _ in range(prompt_tokens)]
    root = root_key(MODEL)
    chain = block_keys_python if python else block_keys
    t0 = time.perf_counter()
    for _ in range(rounds):
        chain(tokens, BLOCK, root)
    return (time.perf_counter() - t0) / rounds * 1e6


def lookup_us(endpoints: int, prompt_tokens: int = PROMPT_TOKENS, rounds: int = 2000, *, python: bool = False) -> float:
    """µs per longest-prefix match; ``python``: the Python walk even when the C one is built."""
    rng = random.Random(1)
    index = KVBlockIndex()
    tokens = [rng.randrange(50_000) for _ in range(prompt_tokens)]
    eps = [_endpoint(i) for i in range(endpoints)]
    n = prompt_tokens // BLOCK
    for i, ep in enumerate(eps):  # each endpoint holds a different share of the prefix
        upto = n * (i + 1) // endpoints
        index.apply(ep, MODEL, [_stored(tuple(rng.getrandbits(63) for _ in range(upto)), None, tokens[: upto * BLOCK])])
    keys = block_keys(tokens, BLOCK, root_key(MODEL))
    match = index.match_python if python else index.match
    t0 = time.perf_counter()
    for _ in range(rounds):
        match(keys, eps)
    return (time.perf_counter() - t0) / rounds * 1e6


def run(args: argparse.Namespace) -> int:
    if not args.lookup_only:
        _memory_and_ingest(args)
    blocks = PROMPT_TOKENS // BLOCK
    chain = "C" if keys_module.NATIVE else "Python (the C chain is not built or PICKER_NATIVE=0)"
    fast, slow = keys_us(), keys_us(python=True)
    print(f"kv-index: block keys of a {PROMPT_TOKENS}-token prompt ({blocks} blocks of {BLOCK}), {chain} vs Python")
    print(f"{'':>9}{'keys µs':>10}{'Python µs':>11}{'ratio':>8}")
    print(f"{'':>9}{fast:>10.1f}{slow:>11.1f}{slow / fast:>7.1f}x")
    walk = "C" if NATIVE else "Python (the C walk is not built or PICKER_NATIVE=0)"
    print(f"kv-index: longest-prefix match of a {PROMPT_TOKENS}-token prompt ({blocks} blocks), {walk} vs Python walk")
    print(f"{'servers':>9}{'match µs':>10}{'Python µs':>11}{'ratio':>8}")
    for count in sorted({1, 4, 16, args.endpoints}):
        fast, slow = lookup_us(count), lookup_us(count, python=True)
        print(f"{count:>9}{fast:>10.1f}{slow:>11.1f}{slow / fast:>7.1f}x")
    return 0


def _memory_and_ingest(args: argparse.Namespace) -> None:
    print(f"kv-index: memory of {args.blocks:,} blocks over {args.endpoints} endpoints ...", flush=True)
    mem = memory(args.blocks, args.endpoints, args.chain, args.shared, args.seed)
    print(
        f"  entries {mem['entries']:,.0f}, keys {mem['keys']:,.0f}: {mem['bytes'] / 2**20:,.1f} MiB, "
        f"{mem['bytes_per_entry']:.0f} B/entry, {mem['entries_per_mib']:,.0f} entries/MiB, "
        f"{mem['mib_per_million']:.0f} MiB per million blocks",
        flush=True,
    )
    print(f"kv-index: ingest of {args.events:,} events ({args.batch}/message, {args.blocks_per_event} block/event)")
    rate = ingest_rate(args.events, args.batch, args.blocks_per_event, args.endpoints, args.seed)
    print(
        f"  {rate['events']:,.0f} events in {rate['messages']:,.0f} messages: "
        f"{rate['events_per_s_cpu']:,.0f} events/s CPU ({rate['events_per_s_wall']:,.0f} wall), "
        f"{rate['blocks_per_s_cpu']:,.0f} blocks/s; unknown parents {rate['unknown_parent']:.0f}",
        flush=True,
    )
