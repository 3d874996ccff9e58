"""The engine in virtual time: prefix cache, batching, chunked prefill, KV exhaustion, LoRA slots, limits."""

from __future__ import annotations

import random
import zlib

import pytest

from picker.sim.config import EngineConfig, StepTiming, preset
from picker.sim.engine import Engine, RequestRejected, RequestState, SimRequest
from picker.sim.tokenizer import default_tokenizer
from picker.sim.virtual import Rejected, run_virtual

WORD_IDS = default_tokenizer().word_ids


def prompt(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.choice(WORD_IDS) for _ in range(n)]


def req(rid: str, n_prompt: int = 64, out: int = 16, *, seed: int | None = None, **kw: object) -> SimRequest:
    ids = prompt(n_prompt, zlib.crc32(rid.encode()) if seed is None else seed)
    return SimRequest(rid, ids, max_tokens=out, ignore_eos=True, **kw)  # type: ignore[arg-type]


def states(results: list[RequestState | Rejected]) -> list[RequestState]:
    out = [r for r in results if isinstance(r, RequestState)]
    assert len(out) == len(results), "unexpected rejection"
    return out


def step_all(engine: Engine, start: float = 0.0) -> list[tuple[float, int, int, tuple[str, ...]]]:
    """Run to idle; the (time, running, waiting, running adapters) seen at every step start."""
    seen = []
    now = start
    while engine.has_work:
        end = engine.begin_step(now)
        assert end is not None
        s = engine.stats()
        seen.append((now, s.running, s.waiting, s.running_loras))
        engine.finish_step()
        now = end
    return seen


TIMING = StepTiming(overhead_s=0.01, prefill_s_per_token=0.0001, decode_s_per_seq=0.001, prefill_overhead_s=0.02)


def test_prefix_cache_hit_lowers_ttft_by_the_cached_share() -> None:
    engine = Engine(EngineConfig(timing=TIMING))
    shared = prompt(1024, 1)
    a = SimRequest("a", shared, max_tokens=1)
    b = SimRequest("b", shared[:768] + prompt(256, 2), max_tokens=1)
    ra, rb = states(run_virtual(engine, [(0.0, a), (10.0, b)]))
    assert ra.cached_tokens == 0
    assert rb.cached_tokens == 768
    fixed = TIMING.overhead_s + TIMING.prefill_overhead_s
    assert ra.ttft_s is not None
    assert rb.ttft_s is not None
    assert (rb.ttft_s - fixed) == pytest.approx((ra.ttft_s - fixed) * (1 - 768 / 1024), rel=0.01)
    stats = engine.stats()
    assert (stats.prefix_queries_tokens, stats.prefix_hits_tokens) == (2048, 768)


def test_identical_prompt_recomputes_its_last_block() -> None:
    engine = Engine(EngineConfig(timing=TIMING))
    ids = prompt(160, 3)  # 10 full blocks of 16
    ra, rb = states(run_virtual(engine, [(0.0, SimRequest("a", ids, 4)), (5.0, SimRequest("b", ids, 4))]))
    assert rb.cached_tokens == 144  # at least one token is computed, so the last full block is not reused
    assert rb.output_ids == ra.output_ids  # same prompt, same answer


def test_prefix_cache_off_never_hits() -> None:
    engine = Engine(EngineConfig(timing=TIMING, enable_prefix_caching=False))
    ids = prompt(256, 4)
    _, rb = states(run_virtual(engine, [(0.0, SimRequest("a", ids, 1)), (5.0, SimRequest("b", ids, 1))]))
    assert rb.cached_tokens == 0


def test_lora_adapters_do_not_share_cache() -> None:
    engine = Engine(EngineConfig(timing=TIMING, lora_adapters=("x",)))
    ids = prompt(256, 5)
    _, rb = states(run_virtual(engine, [(0.0, SimRequest("a", ids, 1)), (5.0, SimRequest("b", ids, 1, lora="x"))]))
    assert rb.cached_tokens == 0


def test_batching_raises_throughput_and_itl() -> None:
    results = {}
    for c in (1, 16):
        engine = Engine(preset("h100-8b"))
        done = states(run_virtual(engine, [(0.0, req(f"r{i}", 128, 128)) for i in range(c)]))
        end = max(s.finished_s or 0.0 for s in done)
        first = done[0]
        assert first.finished_s is not None
        assert first.first_token_s is not None
        itl = (first.finished_s - first.first_token_s) / 127
        results[c] = (c * 128 / end, itl)
    (tput1, itl1), (tput16, itl16) = results[1], results[16]
    assert tput16 > 10 * tput1  # continuous batching: 16 sequences share each step
    assert itl1 < itl16 < 2 * itl1  # each step costs a little more per extra sequence


def test_chunked_prefill_splits_a_long_prompt_into_budgeted_steps() -> None:
    cfg = EngineConfig(timing=TIMING, max_num_batched_tokens=512, num_gpu_blocks=512)
    engine = Engine(cfg)
    [s] = states(run_virtual(engine, [(0.0, SimRequest("a", prompt(1300), max_tokens=1))]))
    # 3 prefill steps: 512 + 512 + 276 tokens.
    expected = 3 * (TIMING.overhead_s + TIMING.prefill_overhead_s) + 1300 * TIMING.prefill_s_per_token
    assert s.ttft_s == pytest.approx(expected)
    assert engine.steps == 3


def test_without_chunked_prefill_an_oversized_prompt_is_rejected() -> None:
    engine = Engine(EngineConfig(timing=TIMING, max_num_batched_tokens=256, enable_chunked_prefill=False))
    with pytest.raises(RequestRejected) as exc:
        engine.submit(SimRequest("a", prompt(300), 1), 0.0)
    assert exc.value.kind == "too_long"


def test_max_num_seqs_caps_the_batch() -> None:
    engine = Engine(EngineConfig(timing=TIMING, max_num_seqs=4))
    for i in range(10):
        engine.submit(req(f"r{i}", 32, 8), 0.0)
    seen = step_all(engine)
    assert max(running for _, running, _, _ in seen) == 4
    assert seen[0][2] == 6  # the rest wait


def test_kv_exhaustion_queues_new_requests() -> None:
    # 20 blocks of 16 tokens; each request needs 4 blocks for its prompt (+1 while decoding).
    cfg = EngineConfig(timing=TIMING, num_gpu_blocks=20, block_size=16)
    engine = Engine(cfg)
    for i in range(8):
        engine.submit(req(f"r{i}", 60, 4), 0.0)
    seen = step_all(engine)
    assert seen[0][1] == 5  # 5 x 4 blocks fill the pool: the other 3 wait despite free sequence slots
    assert seen[0][2] == 3
    assert engine.stats().kv_usage == 0.0
    assert engine.preemptions == 0


def test_a_request_waiting_for_kv_room_is_looked_up_and_counted_at_every_step_as_vllm_does() -> None:
    cfg = EngineConfig(timing=TIMING, num_gpu_blocks=20, block_size=16)
    engine = Engine(cfg)
    for i in range(6):
        engine.submit(req(f"r{i}", 60, 4), 0.0)
    steps_waiting = sum(1 for _, _, waiting, _ in step_all(engine) if waiting)
    stats = engine.stats()
    assert steps_waiting >= 2
    # admitted once each (the lab's cached share); looked up once more at each step that left the sixth waiting
    assert stats.prefix_queries_tokens == 6 * 60
    assert stats.lookup_queries_tokens == stats.prefix_queries_tokens + 60 * steps_waiting
    assert stats.lookup_hits_tokens == stats.prefix_hits_tokens == 0


def test_kv_exhaustion_preempts_and_recomputes() -> None:
    cfg = EngineConfig(timing=TIMING, num_gpu_blocks=12, block_size=16)
    reference = Engine(EngineConfig(timing=TIMING, num_gpu_blocks=1000))
    requests = [req(f"r{i}", 40, 60, seed=i) for i in range(3)]  # each grows from 3 to 7 blocks
    tight = states(run_virtual(Engine(cfg), [(0.0, r) for r in requests]))
    roomy = states(run_virtual(reference, [(0.0, r) for r in requests]))
    assert sum(s.num_preemptions for s in tight) > 0
    for a, b in zip(tight, roomy, strict=True):
        assert a.output_ids == b.output_ids  # preemption delays a request but never changes its answer
        assert a.finish_reason == "length"
    assert max(s.finished_s or 0 for s in tight) > max(s.finished_s or 0 for s in roomy)


def test_lora_slots_limit_concurrency() -> None:
    cfg = EngineConfig(timing=TIMING, lora_adapters=("a", "b", "c"), max_loras=2)
    engine = Engine(cfg)
    for i in range(4):
        engine.submit(req(f"a{i}", 16, 8, lora="a"), 0.0)
        engine.submit(req(f"b{i}", 16, 8, lora="b"), 0.0)
        engine.submit(req(f"c{i}", 16, 8, lora="c"), 0.0)
        engine.submit(req(f"base{i}", 16, 8), 0.0)
    seen = step_all(engine)
    assert all(len(loras) <= 2 for _, _, _, loras in seen)
    assert seen[0][3] == ("a", "b")
    assert seen[0][1] == 12  # a*, b* and base requests run; c* wait for an adapter slot
    assert engine.stats().waiting_loras == ()
    assert any("c" in loras for _, _, _, loras in seen)


def test_lora_waiting_request_is_passed_by_others() -> None:
    cfg = EngineConfig(timing=TIMING, lora_adapters=("a", "b"), max_loras=1)
    engine = Engine(cfg)
    first = engine.submit(req("a0", 16, 50, lora="a"), 0.0)
    engine.begin_step(0.0)
    engine.finish_step()
    blocked = engine.submit(req("b0", 16, 4, lora="b"), 0.1)
    passer = engine.submit(req("a1", 16, 4, lora="a"), 0.1)
    engine.begin_step(0.1)
    stats = engine.stats()
    assert (stats.running, stats.waiting) == (2, 1)
    assert stats.waiting_loras == ("b",)
    engine.finish_step()
    step_all(engine, 1.0)
    assert first.finished_s is not None
    assert passer.finished_s is not None
    assert blocked.scheduled_s is not None
    assert passer.finished_s < blocked.scheduled_s  # b waited for a's slot even though it came first


def test_rejections() -> None:
    engine = Engine(EngineConfig(timing=TIMING, max_model_len=100, max_waiting=2, lora_adapters=("x",)))
    with pytest.raises(RequestRejected, match="maximum context length") as too_long:
        engine.submit(SimRequest("a", prompt(90), max_tokens=20), 0.0)
    assert too_long.value.kind == "too_long"
    with pytest.raises(RequestRejected) as unknown:
        engine.submit(SimRequest("a", prompt(10), lora="nope"), 0.0)
    assert unknown.value.kind == "unknown_model"
    with pytest.raises(RequestRejected) as empty:
        engine.submit(SimRequest("a", []), 0.0)
    assert empty.value.kind == "bad_request"
    with pytest.raises(RequestRejected):
        engine.submit(SimRequest("a", prompt(10), max_tokens=5, min_tokens=6), 0.0)
    engine.submit(SimRequest("a", prompt(10), max_tokens=5), 0.0)
    with pytest.raises(RequestRejected, match="duplicate"):
        engine.submit(SimRequest("a", prompt(10), max_tokens=5), 0.0)
    engine.submit(SimRequest("b", prompt(10), max_tokens=5), 0.0)
    with pytest.raises(RequestRejected) as full:
        engine.submit(SimRequest("c", prompt(10), max_tokens=5), 0.0)
    assert full.value.kind == "queue_full"


def test_request_larger_than_the_kv_pool_is_rejected() -> None:
    engine = Engine(EngineConfig(timing=TIMING, num_gpu_blocks=4, block_size=16))
    with pytest.raises(RequestRejected, match="KV blocks"):
        engine.submit(SimRequest("a", prompt(60), max_tokens=10, ignore_eos=True), 0.0)


def test_output_length_rules() -> None:
    cfg = EngineConfig(timing=TIMING, natural_output_tokens=8)
    engine = Engine(cfg)
    ids = prompt(20, 9)
    results = states(
        run_virtual(
            engine,
            [
                (0.0, SimRequest("eos", ids, max_tokens=100)),
                (0.0, SimRequest("fixed", ids, max_tokens=30, min_tokens=30, ignore_eos=True)),
                (0.0, SimRequest("min", ids, max_tokens=100, min_tokens=40)),
                (0.0, SimRequest("cap", ids, max_tokens=1)),
            ],
        )
    )
    natural, fixed, at_least, capped = results
    assert 1 <= len(natural.output_ids) <= 15
    assert natural.finish_reason == "stop"
    assert (len(fixed.output_ids), fixed.finish_reason) == (30, "length")
    assert (len(at_least.output_ids), at_least.finish_reason) == (40, "stop")
    assert (len(capped.output_ids), capped.finish_reason) == (1, "length")
    assert fixed.output_ids[: len(natural.output_ids)] == natural.output_ids


def test_abort_releases_blocks_immediately() -> None:
    engine = Engine(EngineConfig(timing=TIMING, num_gpu_blocks=64))
    engine.submit(req("a", 100, 50), 0.0)
    engine.submit(req("b", 100, 50), 0.0)
    end = engine.begin_step(0.0)
    assert end is not None
    assert engine.pool.num_free < 64
    engine.abort("a", 0.001)
    engine.abort("b", 0.001)
    assert engine.pool.num_free == 64
    assert engine.finish_step() == []
    assert not engine.has_work


def test_reset_drops_everything() -> None:
    engine = Engine(EngineConfig(timing=TIMING))
    a = engine.submit(req("a", 100, 50), 0.0)
    engine.begin_step(0.0)
    dropped = engine.reset(0.5)
    assert dropped == [a]
    assert a.finish_reason == "abort"
    assert not engine.has_work
    assert engine.step_end_s is None
    assert engine.pool.num_cached == 0


def test_step_protocol_misuse_raises() -> None:
    engine = Engine(EngineConfig(timing=TIMING))
    with pytest.raises(RuntimeError):
        engine.finish_step()
    assert engine.begin_step(0.0) is None  # idle
    engine.submit(req("a"), 0.0)
    engine.begin_step(0.0)
    with pytest.raises(RuntimeError):
        engine.begin_step(0.0)


def test_requests_arriving_mid_step_wait_for_the_next_step() -> None:
    engine = Engine(EngineConfig(timing=TIMING))
    a, b = states(run_virtual(engine, [(0.0, req("a", 64, 4)), (0.001, req("b", 64, 4))]))
    assert a.first_token_s is not None
    assert b.scheduled_s == pytest.approx(a.first_token_s)  # b joins when a's prefill step ends
