import msgpack

from picker.kvcache.index import KVBlockIndex
from picker.kvcache.ingest import Ingestor
from picker.kvcache.keys import block_keys, root_key

A, B = "10.0.0.1:8000", "10.0.0.2:8000"
BS = 4


def frames(seq: int, events: list[object], endpoint: str = A, topic: bytes | None = None) -> list[bytes]:
    t = topic if topic is not None else f"kv@{endpoint}@m".encode()
    return [t, seq.to_bytes(8, "big"), msgpack.packb([0.0, events, None])]


def stored(h: int, parent: int | None, start: int) -> list[object]:
    return ["BlockStored", [h], parent, list(range(start, start + BS)), BS]


def held(idx: KVBlockIndex, endpoint: str, n_blocks: int) -> float:
    keys = block_keys(list(range(n_blocks * BS)), BS, root_key("m"))
    return idx.match(keys, [endpoint]).get(endpoint, 0.0)


def setup() -> tuple[KVBlockIndex, Ingestor]:
    idx = KVBlockIndex()
    ing = Ingestor([idx])
    ing.set_endpoints([A, B])
    return idx, ing


def test_in_order_batches_apply() -> None:
    idx, ing = setup()
    assert ing.receive(frames(0, [stored(1, None, 0)])) is None
    ing.receive(frames(1, [stored(2, 1, BS)]))
    assert held(idx, A, 2) == 2.0
    assert ing.stats.applied == 2


def test_gap_without_replay_resyncs_the_endpoint() -> None:
    idx, ing = setup()
    ing.receive(frames(0, [stored(1, None, 0)]))
    ing.receive(frames(0, [stored(1, None, 0)], endpoint=B))
    ing.receive(frames(5, [["BlockRemoved", [99]]]))  # 1..4 missed: what A holds is unknown now
    assert ing.stats.gaps == 1
    assert ing.stats.missed_batches == 4
    assert ing.stats.resyncs["gap"] == 1
    assert held(idx, A, 1) == 0.0
    assert held(idx, B, 1) == 1.0  # other endpoints are untouched
    ing.receive(frames(6, [stored(1, None, 0)]))
    assert held(idx, A, 1) == 1.0


def test_gap_with_replay_fills_in_and_skips_duplicates() -> None:
    idx, ing = setup()
    ing.receive(frames(0, [stored(1, None, 0)]), can_replay=True)  # first contact at 0: nothing to fetch
    gap = ing.receive(frames(3, [stored(4, 3, 3 * BS)]), can_replay=True)
    assert gap is not None
    assert gap.first_missing == 1
    # The publisher went on meanwhile: the replay reaches batch 4, past the held message.
    replay = [(1, stored(2, 1, BS)), (2, stored(3, 2, 2 * BS)), (3, stored(4, 3, 3 * BS)), (4, stored(5, 4, 4 * BS))]
    for seq, ev in replay:
        ing.replayed(A, seq, msgpack.packb([0.0, [ev], None]))
    ing.close_gap(gap, replay_ok=True)  # batch 3 came with the replay: not applied twice
    assert ing.stats.applied == 5
    assert held(idx, A, 5) == 5.0
    assert ing.stats.resyncs.total() == 0
    ing.receive(frames(4, [stored(5, 4, 4 * BS)]), can_replay=True)  # the live copy of a replayed batch
    assert ing.stats.duplicates == 1
    assert ing.stats.restarts == 0
    ing.receive(frames(5, [["BlockRemoved", [5]]]), can_replay=True)
    assert held(idx, A, 5) == 4.0


def test_first_contact_asks_for_history_and_failed_replay_resyncs() -> None:
    idx, ing = setup()
    gap = ing.receive(frames(7, [stored(1, None, 0)]), can_replay=True)
    assert gap is not None
    assert gap.first_missing == 0
    ing.close_gap(gap, replay_ok=False)
    assert held(idx, A, 1) == 1.0  # nothing to forget yet; the held message applies
    gap = ing.receive(frames(9, [stored(2, 1, BS)]), can_replay=True)
    assert gap is not None
    ing.close_gap(gap, replay_ok=False)
    assert ing.stats.resyncs["replay-failed"] == 1
    assert held(idx, A, 1) == 0.0  # block 1's chain is gone with the resync; block 2 had an unknown parent


def test_publisher_restart_resyncs() -> None:
    idx, ing = setup()
    ing.receive(frames(0, [stored(1, None, 0)]))
    ing.receive(frames(1, [stored(2, 1, BS)]))
    ing.receive(frames(0, [stored(7, None, 100)]))  # a new process: numbering starts again
    assert ing.stats.restarts == 1
    assert held(idx, A, 2) == 0.0
    assert idx.entries == 1


def test_strangers_and_malformed_frames_are_counted_and_dropped() -> None:
    idx, ing = setup()
    ing.receive(frames(0, [stored(1, None, 0)], endpoint="10.9.9.9:8000"))
    ing.receive([b"kv@10.0.0.1:8000@m", b"\x00"])
    ing.receive([b"kv@10.0.0.1:8000@m", b"\x00" * 8, b"\xc1"])
    ing.receive([b"nope", b"\x00" * 8, msgpack.packb([0.0, [], None])])
    assert ing.stats.unknown_endpoint == 1
    assert dict(ing.stats.malformed) == {"frames": 1, "msgpack": 1, "topic": 1}
    assert idx.entries == 0


def test_old_topic_resolves_by_unique_address() -> None:
    idx, ing = setup()
    ing.receive(frames(0, [stored(1, None, 0)], topic=b"kv@10.0.0.2@m"))
    assert held(idx, B, 1) == 1.0
    ing.set_endpoints([A, B, "10.0.0.2:8001"])  # two ranks on that IP: ambiguous
    ing.receive(frames(1, [stored(2, 1, BS)], topic=b"kv@10.0.0.2@m"))
    assert ing.stats.unknown_endpoint == 1


def test_endpoint_leaving_drops_its_entries() -> None:
    idx, ing = setup()
    ing.receive(frames(0, [stored(1, None, 0)]))
    ing.receive(frames(0, [stored(1, None, 0)], endpoint=B))
    assert ing.set_endpoints([B]) == [A]
    assert held(idx, A, 1) == 0.0
    assert held(idx, B, 1) == 1.0
    ing.receive(frames(1, [stored(2, 1, BS)]))  # late message from the departed endpoint
    assert ing.stats.unknown_endpoint == 1
