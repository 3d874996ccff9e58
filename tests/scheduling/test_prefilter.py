"""The large-pool pre-filter: the k least loaded plus the prefix holders; nothing changes at k or fewer."""

from __future__ import annotations

import random

from picker.bench.overhead import prompt_bodies
from picker.endpoints.model import Endpoint
from picker.request.parse import parse_request
from picker.scheduling.config import load_config
from picker.scheduling.framework import CycleState
from picker.scheduling.plugins import prefix
from picker.scheduling.prefilter import Prefilter
from picker.scheduling.profile import PREFILTER
from picker.scheduling.scheduler import Scheduler
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx

REQUESTS = [parse_request({":path": "/v1/completions"}, body) for body in prompt_bodies(2048, n=12)]


def _pool(n: int, rng: random.Random) -> list[Endpoint]:
    return [endpoint(i, waiting=rng.randrange(0, 6), running=rng.randrange(0, 6), kv=rng.random()) for i in range(n)]


def _run(pool: list[Endpoint], order: list[int], k: int) -> list[object]:
    c = ctx(seed=5)
    scheduler = Scheduler(load_config(None, c), c, prefilter_k=k)
    out = []
    for i in order:
        req = REQUESTS[i]
        result = scheduler.schedule(req, pool)
        scheduler.pre_request(req, result)
        lease = c.inflight.acquire(result.targets[0].key, req.prompt_tokens, c.clock())
        if i % 3 == 0:
            c.inflight.release(lease)
        out.append(result.explain())  # targets, every scorer's score and the totals
    return out


def test_pools_of_k_or_fewer_decide_exactly_as_without_it() -> None:
    rng = random.Random(1)
    for n in (1, 2, 5, 16, 32):
        pool = _pool(n, rng)
        order = [rng.randrange(len(REQUESTS)) for _ in range(150)]
        assert _run(pool, order, k=32) == _run(pool, order, k=0)


def test_a_large_pool_keeps_the_k_least_loaded_and_the_prefix_holders_in_order() -> None:
    c = ctx()
    pool = [endpoint(i, waiting=i % 10, running=0) for i in range(1, 41)]  # loads 1..9,0 repeating
    scorer = prefix.create("prefix", prefix.Params(), c)
    assert isinstance(scorer, prefix.PrefixCacheScorer)
    req = request(prompt="x" * 4096)
    busy = pool[8]  # waiting 9: among the busiest
    hashes = scorer._blocks(req, pool, CycleState()).hashes
    scorer.index.add(busy.key, hashes)
    cut = Prefilter(8, c, [scorer]).apply(req, pool, CycleState())
    loads = c.server_tokens(pool)
    least = sorted(range(len(pool)), key=lambda i: (loads[i], i))[:8]
    assert [e.key for e in cut] == [e.key for i, e in enumerate(pool) if i in least or e is busy]
    assert busy in cut
    assert all(e.metrics.waiting <= 1 for e in cut if e is not busy)


def test_a_small_pool_is_passed_on_as_the_same_sequence() -> None:
    pool = [endpoint(i) for i in range(1, 5)]
    assert Prefilter(4, ctx()).apply(request(), pool, CycleState()) is pool
    assert Prefilter(0, ctx()).apply(request(), [*pool, *pool], CycleState()) is not None


def test_the_explanation_shows_the_cut() -> None:
    c = ctx()
    pool = [endpoint(i, waiting=i % 4) for i in range(1, 21)]
    scheduler = Scheduler(load_config(None, c), c, prefilter_k=5)
    result = scheduler.schedule(REQUESTS[0], pool)
    kept = result.runs[0].filtered[PREFILTER]
    assert len(kept) == 5
    assert result.targets[0].key in kept
    small = Scheduler(load_config(None, c), c, prefilter_k=50).schedule(REQUESTS[0], pool)
    assert PREFILTER not in small.runs[0].filtered
