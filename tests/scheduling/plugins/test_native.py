"""The native hot path (``picker.scheduling._native``) against its pure-Python twins: equal on randomized inputs."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
import xxhash

from picker.bench.overhead import prompt_bodies
from picker.bench.schedule import bench_endpoints
from picker.endpoints import serverload
from picker.endpoints.inflight import EndpointLoad
from picker.endpoints.model import Endpoint
from picker.request.parse import parse_request
from picker.scheduling import native as scheduling_native
from picker.scheduling.config import load_config
from picker.scheduling.framework import CycleState
from picker.scheduling.plugins import prefix, prefix_index
from picker.scheduling.plugins.prefix_index import PyPrefixIndex, py_match, py_prefix_hashes
from picker.scheduling.prefilter import Prefilter, py_select
from picker.scheduling.scheduler import Scheduler
from tests.conftest import endpoint
from tests.scheduling.helpers import ctx

# scripts/install.sh builds the extension (setup.py, gcc); a machine where it did not build fails here rather
# than skipping: the pure-Python twins are checked against it, so without it nothing below is tested.
try:
    from picker.scheduling import _native as native
except ImportError as exc:  # pragma: no cover - an install problem, not a test outcome
    raise ImportError("picker.scheduling._native is not built: run scripts/install.sh with a C compiler") from exc

REQUESTS = [parse_request({":path": "/v1/completions"}, body) for body in prompt_bodies(4096)]

# ASCII, 2-, 3- and 4-byte UTF-8 characters: block cuts land inside characters too.
ALPHABET = "abcdefghij KLMNOP 0123456789 .,\n\té ß ñ ü € 中文 字 🙂 🚀"


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def test_xxh64_matches_the_xxhash_library_at_every_length() -> None:
    # h0 = xxh64(model) over 0..199 bytes, h1 = xxh64(block ‖ le64(h0)) over 9..208: every stripe and tail path
    for n in range(200):
        model, text = "m" * n, "t" * (n + 1)
        h0 = xxhash.xxh64_intdigest(model.encode())
        expected = xxhash.xxh64_intdigest(text.encode() + h0.to_bytes(8, "little"))
        assert native.prefix_hashes(text, n + 1, 1, model) == (expected,)


def test_prefix_hashes_equal_on_random_prompts() -> None:
    rng = random.Random(13)
    for _ in range(2000):
        text = _text(rng, rng.randrange(0, 700))
        block = rng.choice([1, 3, 7, 16, 31, 64, 100, 257])
        max_blocks = rng.choice([0, 1, 2, 5, 256, 10_000])
        model = _text(rng, rng.randrange(0, 20))
        salt = rng.choice(["", _text(rng, rng.randrange(1, 10))])
        assert native.prefix_hashes(text, block, max_blocks, model, salt) == py_prefix_hashes(
            text, block, max_blocks, model, salt
        ), (text, block, max_blocks, model, salt)
    assert native.prefix_hashes("abcd" * 40, 16, 256, "m") == py_prefix_hashes("abcd" * 40, 16, 256, "m")
    assert native.prefix_hashes("abcd" * 40, 0, 256, "m") == py_prefix_hashes("abcd" * 40, 0, 256, "m") == ()


def test_match_equal_on_random_indexes() -> None:
    rng = random.Random(7)
    keys = [f"10.0.0.{i}:8000" for i in range(12)]
    for _ in range(200):
        index = PyPrefixIndex(capacity_per_endpoint=rng.choice([5, 50, 500]))
        prompts = [tuple(rng.randrange(1, 2**64) for _ in range(rng.randrange(1, 40))) for _ in range(8)]
        for _ in range(rng.randrange(0, 30)):
            chain = rng.choice(prompts)
            index.add(rng.choice(keys), chain[: rng.randrange(1, len(chain) + 1)])
        if rng.random() < 0.3:
            index.retain(rng.sample(keys, rng.randrange(0, len(keys))))
        holders = index._holders
        for chain in prompts:
            assert native.match(holders, chain) == py_match(holders, chain)
            assert native.match(holders, list(chain)) == py_match(holders, chain)
        assert native.match(holders, ()) == {}


def test_the_index_equals_the_python_index_after_random_operations() -> None:
    """Learning (with duplicates, re-learning, per-call capacities), eviction, retain: every answer the same."""
    rng = random.Random(11)
    keys = [f"10.0.0.{i}:8000" for i in range(10)]
    for _ in range(60):
        capacity = rng.choice([1, 3, 20, 200])
        fast, slow = native.PrefixIndex(capacity), PyPrefixIndex(capacity)
        prompts = [[rng.randrange(0, 2**64) for _ in range(rng.randrange(1, 60))] for _ in range(10)]
        prompts.append([5, 5, 6, 5])  # duplicates within one prompt
        for _ in range(rng.randrange(1, 400)):
            roll = rng.random()
            if roll < 0.85:
                chain = rng.choice(prompts)
                chain = chain[: rng.randrange(0, len(chain) + 1)]
                key = rng.choice(keys)
                cap = rng.choice([None, None, 0, rng.randrange(1, 80)])
                assert fast.add(key, chain, cap) == slow.add(key, chain, cap)
            elif roll < 0.95:
                chain = rng.choice(prompts)
                assert fast.match(chain) == slow.match(chain)
            else:
                kept = rng.sample(keys, rng.randrange(0, len(keys)))
                assert fast.retain(kept) == slow.retain(kept)
            assert fast.size == slow.size
        for chain in prompts:
            assert fast.match(chain) == slow.match(chain)
            assert fast.match(tuple(chain)) == slow.match(tuple(chain))
        assert [fast.endpoint_blocks(k) for k in keys] == [slow.endpoint_blocks(k) for k in keys]
        assert fast.match([]) == {}
        assert fast.add("x", []) == 0
        assert fast.endpoint_blocks("x") == 0


def test_the_index_refuses_what_the_python_index_could_not_hold() -> None:
    index = native.PrefixIndex(4)
    with pytest.raises(TypeError):
        index.add("a", ["not a hash"])  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        index.add("a", [-1])
    with pytest.raises(TypeError):
        index.add(1, [1])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.PrefixIndex("four")  # type: ignore[arg-type]
    index.add("a", [1, 2])
    assert index.match([1, 2]) == {"a": 2}


def test_the_module_uses_native_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (prefix_index.prefix_hashes is native.prefix_hashes) == scheduling_native.NATIVE
    assert (prefix_index.PrefixIndex is native.PrefixIndex) == scheduling_native.NATIVE
    monkeypatch.setenv("PICKER_NATIVE", "0")
    assert scheduling_native.load() is None
    monkeypatch.setenv("PICKER_NATIVE", "1")
    assert scheduling_native.load() is native


def test_bad_arguments_raise_like_python() -> None:
    with pytest.raises(TypeError):
        native.prefix_hashes(b"bytes", 16, 256, "m")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.match([], (1, 2))  # type: ignore[arg-type]


def test_the_default_scheduler_decides_the_same_on_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = REQUESTS
    rng = random.Random(3)
    order = [rng.randrange(len(requests)) for _ in range(300)]

    def picks() -> list[str]:
        c = ctx()
        scheduler = Scheduler(load_config(None, c), c)
        eps = bench_endpoints(24, now=c.clock())
        out = []
        for i in order:
            result = scheduler.schedule(requests[i], eps)
            scheduler.pre_request(requests[i], result)
            out.append(result.targets[0].key)
        return out

    fast = picks()
    monkeypatch.setattr(prefix, "prefix_hashes", py_prefix_hashes)
    monkeypatch.setattr(prefix, "PrefixIndex", PyPrefixIndex)
    monkeypatch.setattr(prefix_index, "_match", py_match)
    assert picks() == fast


def _random_pool(rng: random.Random, n: int) -> list[Endpoint]:
    now = 1000.0
    return [
        endpoint(
            i,
            waiting=rng.randrange(0, 9),
            running=rng.randrange(0, 9),
            updated_at=rng.choice([0.0, now - 5.0, now - 2.0, now - 0.5, now]),
            own_requests=rng.choice([None, 0, 1, 3]),
        )
        for i in range(n)
    ]


def test_tokens_of_equals_the_python_loop_on_random_pools() -> None:
    rng = random.Random(17)
    for _ in range(300):
        pool = _random_pool(rng, rng.randrange(0, 40))
        loads = {
            e.key: EndpointLoad(requests=rng.randrange(0, 6), tokens=rng.randrange(0, 50_000))
            for e in pool
            if rng.random() < 0.5
        }
        per_request, per_decode = rng.uniform(1, 3000), rng.uniform(1, 500)
        now, max_age = 1000.0, rng.choice([1.0, 2.0, 10.0])

        def load(key: str, loads: dict[str, EndpointLoad] = loads) -> EndpointLoad:
            return loads.get(key) or EndpointLoad()

        expected = serverload.tokens_of(pool, load, now, per_request, per_decode, max_age)
        assert native.tokens_of(pool, loads, now, per_request, per_decode, max_age) == expected
        requests = serverload.requests_of(pool, load, now, max_age)
        assert native.tokens_of(pool, loads, now, 0.0, 0.0, max_age, 1) == requests
        waiting = serverload.waiting_of(pool, load, now, max_age)
        assert native.tokens_of(pool, loads, now, 0.0, 0.0, max_age, 2) == waiting
        foreign = serverload.foreign_of(pool, load, now, max_age)
        assert native.tokens_of(pool, loads, now, 0.0, 0.0, max_age, 3) == foreign


def test_tokens_of_declines_values_it_cannot_read_exactly() -> None:
    pool = [
        endpoint(1),
        dataclasses.replace(endpoint(2), metrics=dataclasses.replace(endpoint(2).metrics, waiting=1.5)),
    ]
    assert native.tokens_of(pool, {}, 1000.0, 1.0, 1.0, 2.0) is None  # type: ignore[arg-type]


def test_tokens_of_rejects_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode must be 0"):
        native.tokens_of([endpoint(1)], {}, 1000.0, 0.0, 0.0, 2.0, 4)


def test_counts_too_large_for_exact_doubles_take_the_python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # A broken page reporting 2^40 waiting: waiting x foreign overflows a C integer. Python's ints are exact, so
    # the C paths decline and the pre-filter's cut is the pure-Python one.
    huge = endpoint(2, waiting=2**40, running=3, updated_at=1000.0)
    pool = (endpoint(1, waiting=1, updated_at=1000.0), huge, endpoint(3, updated_at=1000.0))
    assert native.tokens_of(pool, {}, 1000.0, 10.0, 5.0, 2.0) is None
    assert native.tokens_of(pool, {}, 1000.0, 0.0, 0.0, 2.0, 1) is None
    assert native.tokens_of(pool, {}, 1000.0, 0.0, 0.0, 2.0, 2) is None
    assert native.tokens_of(pool, {}, 1000.0, 0.0, 0.0, 2.0, 3) is None
    table = native.LoadTable()
    assert table.select(pool, {}, 1000.0, 10.0, 5.0, 2.0, 1, None) is None
    assert table.select(pool, {}, 1000.0, 10.0, 5.0, 2.0, 1, None) is None  # declined when building
    fine = (pool[0], endpoint(2, waiting=4, updated_at=1000.0, own_requests=None), pool[2])
    for _ in range(2):
        table.select(fine, {}, 1000.0, 10.0, 5.0, 2.0, 1, None)
    ledger = {fine[1].key: EndpointLoad(requests=-(2**51), tokens=1)}  # too large through the ledger's count
    assert table.select(fine, ledger, 1000.0, 10.0, 5.0, 2.0, 1, None) is None
    cut = Prefilter(2, ctx())  # its clock reads 1000.0
    fast = [cut.apply(REQUESTS[0], pool, CycleState()) for _ in range(3)]
    monkeypatch.setattr(scheduling_native, "module", None)
    assert fast == [cut.apply(REQUESTS[0], pool, CycleState())] * 3 == [[pool[0], pool[2]]] * 3


def test_select_equals_the_python_selection_on_random_loads() -> None:
    rng = random.Random(19)
    for _ in range(500):
        n = rng.randrange(0, 60)
        pool = [endpoint(i) for i in range(n)]
        loads = [float(rng.choice([0, 1, 2, 3, 100, rng.random()])) for _ in range(n)]
        k = rng.randrange(0, n + 3)
        held = {e.key for e in pool if rng.random() < 0.1}
        expected = py_select(pool, loads, k, held)
        assert native.select(pool, loads, k, held) == expected
        assert native.select(pool, loads, k, None) == py_select(pool, loads, k, ())
    assert native.select([endpoint(1)], [math.nan], 1, None) is None
    with pytest.raises(ValueError, match="one load per endpoint"):
        native.select([endpoint(1)], [], 1, None)


def test_the_load_table_selects_as_tokens_of_then_select_on_random_pools() -> None:
    # One table across many calls, as a Prefilter keeps it: a pool's tuple comes several times in a row (built on
    # its second call), with a new ledger, clock, averages, k and holders each time, then a new pool.
    rng = random.Random(31)
    table = native.LoadTable()
    built = 0
    for _ in range(60):
        pool = tuple(_random_pool(rng, rng.randrange(0, 90)))
        for call in range(6):
            loads = {
                e.key: EndpointLoad(requests=rng.randrange(0, 6), tokens=rng.randrange(0, 50_000))
                for e in pool
                if rng.random() < 0.3
            }
            loads["10.9.9.9:1"] = EndpointLoad(requests=2, tokens=9)  # not a candidate: no effect
            now, max_age = rng.choice([1000.0, 1003.5]), rng.choice([1.0, 2.0, 10.0])
            per_request, per_decode = rng.uniform(1, 3000), rng.choice([0.0, rng.uniform(1, 500)])
            k = rng.randrange(0, len(pool) + 3)
            held = rng.choice([None, set(), {e.key for e in pool if rng.random() < 0.1} | {"10.9.9.9:2"}])
            got = table.select(pool, loads, now, per_request, per_decode, max_age, k, held)
            if call == 0:
                assert got is None, "a tuple seen once is not built for"
                continue
            built += 1
            tokens = native.tokens_of(pool, loads, now, per_request, per_decode, max_age)
            assert got == py_select(pool, tokens, k, held or ()), (call, k)
    assert built == 300


def test_the_load_table_declines_what_it_cannot_describe() -> None:
    table = native.LoadTable()
    pool = tuple(endpoint(i, waiting=i, updated_at=1000.0) for i in range(4))
    args = (1000.0, 10.0, 5.0, 2.0, 2, None)
    assert table.select(list(pool), {}, *args) is None  # a list may change under it: never built for
    assert table.select(pool, {}, *args) is None  # seen once
    assert table.select(pool, {}, *args) == list(pool[:2])
    hinted = pool[2:]  # a request with a subset hint between the pool's own: its tuple once, then the pool's
    assert table.select(hinted, {}, *args) is None
    assert table.select(pool, {}, *args) == list(pool[:2]), "the pool's table stays built"
    assert table.select(pool, {pool[0].key: EndpointLoad(requests=1, tokens=1.5)}, *args) is None  # type: ignore[arg-type]
    assert table.select(pool, {}, 1000.0, math.nan, 5.0, 2.0, 2, None) is None  # NaN loads: as select
    assert table.select(pool, {}, *args[:-1], frozenset()) is not None
    assert table.select(pool, {}, *args[:-1], [pool[3].key]) is None  # a held list: a linear search, not here
    duplicate = (*pool, pool[0])
    odd_metrics = dataclasses.replace(pool[0].metrics, waiting=1.5)
    fractional = (*pool, dataclasses.replace(pool[0], key="x", metrics=odd_metrics))
    for odd in (duplicate, fractional):
        assert table.select(odd, {}, *args) is None
        assert table.select(odd, {}, *args) is None  # declined, and remembered as such
        assert table.select(odd, {}, *args) is None


def test_the_prefilter_cuts_the_same_on_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(23)
    c = ctx()
    for _ in range(50):
        pool = _random_pool(rng, 80)
        for e in pool[::3]:
            c.inflight.acquire(e.key, rng.randrange(1, 4000), 1000.0)
        cut = Prefilter(16, c)
        req = REQUESTS[0]
        fast = cut.apply(req, pool, CycleState())
        candidates = tuple(pool)  # the snapshot's tuple: the table's path from its second call
        assert [cut.apply(req, candidates, CycleState()) for _ in range(3)] == [fast] * 3
        monkeypatch.setattr(scheduling_native, "module", None)
        assert cut.apply(req, pool, CycleState()) == fast
        monkeypatch.undo()


def test_the_context_helpers_equal_the_plugin_context(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(29)
    c = ctx()
    pool = _random_pool(rng, 50)
    for e in pool[::2]:
        c.inflight.acquire(e.key, rng.randrange(1, 4000), 1000.0)
    assert scheduling_native.server_tokens(c, pool) == c.server_tokens(pool)
    assert scheduling_native.server_requests(c, pool) == c.server_requests(pool)
    assert scheduling_native.server_waiting(c, pool) == c.server_waiting(pool)
    assert scheduling_native.server_foreign(c, pool) == c.server_foreign(pool)
    assert any(scheduling_native.server_foreign(c, pool))  # some servers report requests picker did not send
    monkeypatch.setattr(scheduling_native, "module", None)
    assert scheduling_native.server_tokens(c, pool) == c.server_tokens(pool)
    assert scheduling_native.server_foreign(c, pool) == c.server_foreign(pool)


def test_with_peers_the_load_estimates_count_the_peers_in_flight_requests() -> None:
    # With a peer exchange the peers' counts join picker's own ledger (PluginContext.ledger_loads) before the
    # native loops read it: the same numbers as PluginContext.server_load's exact path, the C extension or not.
    import random

    from picker.endpoints.inflight import InflightTracker
    from picker.endpoints.peerload import PeerLoads
    from picker.plugins import PluginContext
    from picker.scheduling import native as load_path
    from tests.conftest import FakeClock, endpoint

    clock = FakeClock()
    peers = PeerLoads(ttl_s=5.0)
    ctx = PluginContext(clock=clock, inflight=InflightTracker(), rng=random.Random(1), peers=peers)
    # The poller notes picker's and its peers' in flight at each sample: 0 on the first server, the peer's 4 on
    # the second.
    eps = [endpoint(i, waiting=2, running=3, updated_at=clock.now, own_requests=n) for i, n in ((1, 0), (2, 4))]
    ctx.inflight.acquire(eps[0].key, 500, clock.now)
    peers.update(1, clock.now, {eps[1].key: (4, 4000)}, full=True)
    per_request, per_decode = ctx.inflight.request_tokens, ctx.inflight.decode_tokens
    assert load_path.server_tokens(ctx, eps) == [ctx.server_load(e).tokens(per_request, per_decode) for e in eps]
    assert load_path.server_requests(ctx, eps) == [ctx.server_load(e).requests for e in eps]
    assert load_path.server_requests(ctx, eps)[1] == 5  # the peer's 4 in flight explain 4 of the 5 reported
    assert ctx.server_tokens(eps) == load_path.server_tokens(ctx, eps)  # the pure-Python loop agrees
    assert ctx.server_requests(eps) == load_path.server_requests(ctx, eps)
    assert ctx.ledger_loads()[eps[1].key].requests == 4  # the peer's
    assert ctx.ledger_loads()[eps[0].key].requests == 1  # picker's own
    peers.update(1, clock.now, {}, full=True)  # the peer has nothing left in flight: picker's own entries again
    assert ctx.ledger_loads() == ctx.inflight.loads()
    assert ctx.ledger_loads()[eps[0].key] is ctx.inflight.loads()[eps[0].key]
