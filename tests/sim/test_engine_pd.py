"""The engine's decode role: a remotely prefilled prompt's KV is pulled over the link, not computed."""

from __future__ import annotations

import pytest

from picker.sim.config import EngineConfig, StepTiming, link_s_per_token
from picker.sim.engine import Engine, RequestState, SimRequest
from picker.sim.tokenizer import default_tokenizer
from picker.sim.virtual import run_virtual

WORDS = default_tokenizer().word_ids
# Exact binary fractions, so times compare exactly.
TIMING = StepTiming(overhead_s=2**-7, prefill_s_per_token=2**-13, decode_s_per_seq=2**-10, prefill_overhead_s=2**-5)
PER_TOKEN = 2**-12  # link: 0.24 ms per token
CONFIG = EngineConfig(timing=TIMING, block_size=16, num_gpu_blocks=256, kv_transfer_s_per_token=PER_TOKEN)


def ids(n: int, offset: int = 0) -> list[int]:
    return [WORDS[(i + offset) % len(WORDS)] for i in range(n)]


def remote(rid: str, prompt: list[int], out: int = 4) -> SimRequest:
    return SimRequest(rid, prompt, max_tokens=out, ignore_eos=True, remote_prefill=True)


def finished(results: list[RequestState | object]) -> list[RequestState]:
    out = [r for r in results if isinstance(r, RequestState)]
    assert len(out) == len(results)
    return out


def test_link_speed_in_seconds_per_token() -> None:
    assert link_s_per_token(131072, 100.0) == pytest.approx(131072 * 8 / 100e9)
    with pytest.raises(ValueError, match="link_gbps"):
        link_s_per_token(131072, 0.0)


def test_a_remote_prefill_waits_for_its_transfer_then_takes_one_decode_shaped_step() -> None:
    engine = Engine(CONFIG)
    [state] = finished(run_virtual(engine, [(0.0, remote("r", ids(200), out=3))]))
    stats = engine.stats()
    assert (stats.pulled_tokens, stats.prefill_tokens) == (200, 0)  # its last prompt token ran decode-shaped
    assert stats.max_step_s == pytest.approx(TIMING.overhead_s + TIMING.decode_s_per_seq)
    transfer = 200 * PER_TOKEN  # nothing cached locally: the whole prompt comes over the link
    step = TIMING.overhead_s + TIMING.decode_s_per_seq  # no prefill pass, no prefill overhead
    assert state.transfer_tokens == 200
    assert state.ttft_s == pytest.approx(transfer + step)
    assert state.finished_s == pytest.approx(transfer + 3 * step)
    assert state.cached_tokens == 0


def test_the_same_prompt_prefilled_locally_takes_a_prefill_step() -> None:
    engine = Engine(CONFIG)
    [state] = finished(run_virtual(engine, [(0.0, SimRequest("r", ids(200), max_tokens=3, ignore_eos=True))]))
    prefill_step = TIMING.overhead_s + TIMING.prefill_overhead_s + 200 * TIMING.prefill_s_per_token
    assert state.ttft_s == pytest.approx(prefill_step)
    stats = engine.stats()
    assert (stats.pulled_tokens, stats.prefill_tokens) == (0, 200)
    assert stats.max_step_s == pytest.approx(prefill_step)


def test_only_what_is_not_cached_locally_is_pulled() -> None:
    engine = Engine(CONFIG)
    prefix = ids(160)  # 10 full blocks
    first = SimRequest("a", [*prefix, *ids(8, 500)], max_tokens=1, ignore_eos=True)
    second = remote("b", [*prefix, *ids(40, 900)])
    _, b = finished(run_virtual(engine, [(0.0, first), (1.0, second)]))
    assert b.cached_tokens == 160
    assert b.transfer_tokens == 40
    assert b.ttft_s == pytest.approx(40 * PER_TOKEN + TIMING.overhead_s + TIMING.decode_s_per_seq)


def test_transfers_share_the_link_one_after_another() -> None:
    a, b = finished(run_virtual(Engine(CONFIG), [(0.0, remote("a", ids(100))), (0.0, remote("b", ids(100, 300)))]))
    assert a.ready_s == pytest.approx(100 * PER_TOKEN)
    assert b.ready_s == pytest.approx(200 * PER_TOKEN)
    assert a.first_token_s is not None
    assert b.first_token_s is not None
    assert b.first_token_s > a.first_token_s


def test_a_pull_does_not_stall_the_decoding_batch_but_a_local_prefill_does() -> None:
    decoding = SimRequest("d", ids(32), max_tokens=100, ignore_eos=True)  # ~0.9 s: the pull lands meanwhile
    long_prompt = ids(2000, 77)
    pulled = _max_itl(decoding, remote("n", long_prompt))
    local = _max_itl(decoding, SimRequest("n", long_prompt, max_tokens=4, ignore_eos=True))
    decode_step = TIMING.overhead_s + 2 * TIMING.decode_s_per_seq  # two sequences in the batch
    assert pulled == pytest.approx(decode_step)
    # The newcomer's prefill step holds the decoder's next token back by the whole prefill.
    prefill = TIMING.prefill_overhead_s + 2000 * TIMING.prefill_s_per_token
    assert local >= TIMING.overhead_s + TIMING.decode_s_per_seq + prefill


def _max_itl(decoding: SimRequest, newcomer: SimRequest) -> float:
    """The decoding request's largest gap between tokens when ``newcomer`` arrives 0.1 s into it."""
    engine = Engine(CONFIG)
    pending = [(0.0, decoding), (0.1, newcomer)]
    worst = 0.0
    now = 0.0
    i = 0
    while True:
        end = engine.step_end_s
        if end is None and engine.has_work:
            end = engine.next_wakeup_s
        arrival = pending[i][0] if i < len(pending) else None
        if end is not None and (arrival is None or end < arrival):
            now = end
            if engine.step_end_s is not None:
                for state in engine.finish_step():
                    if state.request_id == "d" and state.last_itl_s is not None:
                        worst = max(worst, state.last_itl_s)
        elif arrival is not None:
            now = arrival
            engine.submit(pending[i][1], now)
            i += 1
        else:
            break
        if engine.step_end_s is None and engine.has_work:
            engine.begin_step(now)
    return worst


def test_a_loading_request_counts_as_waiting_and_abort_frees_its_blocks() -> None:
    engine = Engine(CONFIG)
    free = engine.pool.num_free
    state = engine.submit(remote("r", ids(100)), 0.0)
    assert engine.begin_step(0.0) is None  # nothing to compute yet: the KV is on its way
    assert engine.stats().waiting == 1
    assert engine.next_wakeup_s == pytest.approx(100 * PER_TOKEN)
    assert engine.pool.num_free == free - 7  # 100 tokens in 16-token blocks
    engine.abort("r", 0.001)
    assert state.finish_reason == "abort"
    assert engine.pool.num_free == free
    assert not engine.has_work
    assert engine.next_wakeup_s is None
