"""The server model: slot waits, answer lengths, the step-time fit, learned capacity, prefill rate."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from picker.endpoints.inflight import Lease
from picker.endpoints.model import Endpoint
from picker.plugins.api import PluginContext
from picker.scheduling import servermodel
from picker.scheduling.servermodel import Demand, Estimate, ServerModel, StepFit, answer_tokens, start_wait_s
from tests.conftest import endpoint
from tests.scheduling.helpers import ctx


def _running(*seconds: float, kv: float = 10.0) -> list[Demand]:
    return [Demand(t, kv) for t in seconds]


OURS = Demand(1.0, 10.0)


def test_a_free_slot_means_no_wait() -> None:
    assert start_wait_s(_running(5.0, 1.0), [], OURS, slots=3, kv_tokens=math.inf) == 0.0


def test_a_full_server_frees_its_soonest_slot_first() -> None:
    assert start_wait_s(_running(5.0, 1.0, 3.0), [], OURS, slots=3, kv_tokens=math.inf) == 1.0


def test_requests_queued_ahead_take_the_slots_that_free_first() -> None:
    # The first queued request takes the slot free at 1 s and holds it 2 s more (until 3 s); ours gets the next
    # slot to free: 3 s (the one that was running, or the queued one's: both at 3 s).
    running = _running(5.0, 1.0, 3.0)
    assert start_wait_s(running, _running(2.0), OURS, slots=3, kv_tokens=math.inf) == 3.0
    assert start_wait_s(running, _running(2.0, 10.0), OURS, slots=3, kv_tokens=math.inf) == 3.0
    assert start_wait_s(running, _running(2.0, 10.0, 0.5), OURS, slots=3, kv_tokens=math.inf) == 3.5


def test_a_free_slot_without_kv_room_waits_for_kv() -> None:
    running = [Demand(5.0, 600.0), Demand(2.0, 600.0)]
    assert start_wait_s(running, [], Demand(1.0, 500.0), slots=16, kv_tokens=1700.0) == 0.0
    assert start_wait_s(running, [], Demand(1.0, 600.0), slots=16, kv_tokens=1700.0) == 2.0


@pytest.mark.parametrize(
    ("max_tokens", "fixed", "mean", "expected"),
    [(512, True, 40.0, 512.0), (512, False, 40.0, 40.0), (16, False, 40.0, 16.0), (0, False, 40.0, 40.0)],
)
def test_answer_length(max_tokens: int, fixed: bool, mean: float, expected: float) -> None:
    assert answer_tokens(max_tokens, fixed, mean) == expected


def test_the_step_fit_recovers_a_line_through_the_batches_seen() -> None:
    fit = StepFit()
    a0, c0 = fit.coefficients()
    assert a0 == servermodel.DEFAULT_STEP_S
    assert 0.0 < c0 <= 0.001 * a0  # no slope known: the least one, so more in flight is never cheaper
    for i in range(400):
        batch = float(i % 16 + 1)
        fit.add(batch, 0.03 + 0.002 * batch)
    a, c = fit.coefficients()
    assert a == pytest.approx(0.03, rel=1e-3)
    assert c == pytest.approx(0.002, rel=1e-3)


def test_the_step_fit_without_varying_batches_is_the_mean() -> None:
    fit = StepFit()
    for _ in range(10):
        fit.add(4.0, 0.05)
    a, c = fit.coefficients()
    assert a == pytest.approx(0.05)
    assert 0.0 < c <= 0.001 * a


def _report(i: int, waiting: int, running: int, at: float, kv: float = 0.0) -> Endpoint:
    return endpoint(i, waiting=waiting, running=running, kv=kv, updated_at=at)


def _reports(model: ServerModel, times: tuple[float, ...], *pool: tuple[int, int, int, float]) -> None:
    """Reports of ``pool`` ((server, waiting, running, kv)) at ``times``, one of picker's requests finishing on
    each server between two reports (a slot freed and taken again)."""
    for t in times:
        model.observe_reports([_report(i, w, r, t, kv=kv) for i, w, r, kv in pool])
        for i, *_ in pool:
            model.observe_done(_report(i, 0, 0, 0.0).key)


def test_capacity_is_the_most_a_server_ran_seen_there_with_a_queue_in_several_reports() -> None:
    model = ServerModel(ctx())
    assert model.capacity(_report(1, 0, 0, 1000.0).key) == 0  # nothing learned: no limit
    _reports(model, (999.7, 999.8, 999.9), (1, 3, 12, 0.0), (2, 0, 5, 0.0), (3, 2, 40, 0.95))
    key1, key2, key3 = (_report(i, 0, 0, 0.0).key for i in (1, 2, 3))
    assert model.capacity(key1) == 12
    assert model.capacity(key2) == 12  # no limit of its own: the pool's
    assert model.capacity(key3) == 40  # queueing on a full KV cache says nothing of the slots; it ran 40
    model.observe_reports([_report(1, 3, 12, 999.9)])  # the same report again counts once
    model.observe_reports([_report(1, 0, 16, 1000.0)])  # it ran more: 16, not yet a limit
    assert model.capacity(key1) == 0  # no limit known in the pool any more: none


def test_a_queue_that_no_finished_request_drained_is_no_slot_limit() -> None:
    # One long step (a prompt of thousands of tokens) holds a server's state for many reports: the same running
    # count with a queue, report after report, but no slot freed in between.
    model = ServerModel(ctx())
    for t in (999.5, 999.6, 999.7, 999.8, 999.9):
        model.observe_reports([_report(1, 4, 5, t)])
    key = _report(1, 0, 0, 0.0).key
    assert model.capacity(key) == 0
    model.observe_done(key)  # a slot freed, and the next report still shows the queue at 5: evidence, once
    model.observe_reports([_report(1, 4, 5, 1000.0)])
    assert model.capacity(key) == 0


def test_requests_waiting_with_none_running_are_no_slot_limit() -> None:
    model = ServerModel(ctx())
    _reports(model, (999.6, 999.7, 999.8, 999.9), (1, 3, 0, 0.0), (2, 1, 4, 0.0))  # an adapter that cannot load
    assert model.capacity(_report(1, 0, 0, 0.0).key) == 4  # the pool's known limit, not 0
    assert model.estimate("m", 4.0, [10.0], [_report(1, 3, 0, 999.9)])[0].ttft_s > 0.0


def test_a_queue_for_an_adapter_not_loaded_is_no_slot_limit() -> None:
    # max_loras 1: "b" runs on 5 sequences, requests for "a" wait for the adapter slot, not for a sequence slot
    model = ServerModel(ctx())
    key = _report(1, 0, 0, 0.0).key
    for t in (999.5, 999.6, 999.7, 999.8):
        model.observe_reports([endpoint(1, waiting=3, running=5, loras=("b",), waiting_loras=("a",), updated_at=t)])
        model.observe_done(key)
    assert model.capacity(key) == 0
    for t in (999.85, 999.9, 999.95):  # waiting for an adapter that runs: a sequence slot
        model.observe_reports([endpoint(1, waiting=3, running=5, loras=("a", "b"), waiting_loras=("a",), updated_at=t)])
        model.observe_done(key)
    assert model.capacity(key) == 5


def test_a_queue_while_the_batch_grows_is_no_slot_limit() -> None:
    model = ServerModel(ctx())
    model.observe_reports([_report(1, 2, 0, 999.4)])  # a server that has run nothing yet, with a queue
    for i, t in enumerate((999.5, 999.6, 999.7, 999.8)):
        model.observe_reports([_report(1, 4, 20 + 5 * i, t)])  # prefills waiting for the step's token budget
    assert model.capacity(_report(1, 0, 0, 0.0).key) == 0


def test_a_full_server_of_long_answers_waits_longer_than_one_of_short_answers() -> None:
    c = ctx()
    model = ServerModel(c)
    _reports(model, (999.7, 999.8, 999.9), (1, 1, 2, 0.0), (2, 1, 2, 0.0))
    longs, shorts = endpoint(1, waiting=1, running=2), endpoint(2, waiting=1, running=2)
    model.observe_reports([longs, shorts])
    now = c.clock()
    for key, answer in ((longs.key, 512), (shorts.key, 4)):
        for _ in range(2):
            lease = c.inflight.acquire(
                key, 10 + answer, now, prefill_tokens=10, max_output_tokens=answer, fixed_output=True
            )
            c.inflight.prefilled(lease, 10, now)
    # Each reported 2 running (picker's) and 1 waiting beyond picker's: full, one queued ahead.
    found = model.estimate("m", 4.0, [10.0, 10.0], [longs, shorts])
    assert found[1].slot_wait_s < found[0].slot_wait_s
    assert found[1].ttft_s < found[0].ttft_s


def test_the_prefill_rate_is_a_line_through_what_first_tokens_showed_resistant_to_queues() -> None:
    model = ServerModel(ctx())
    predicted = Estimate(ttft_s=0.0, tpot_s=0.01, fixed_s=0.01, prefill_tokens=100.0, speed=1.0, own_tokens=100.0)
    for i in range(30):  # 0.035 s per prefill plus 0.1 ms per token, every seventh first token a second late
        tokens = 100.0 * (1 + i % 10)
        late = 1.0 if i % 7 == 3 else 0.0
        model.observe_first_token(
            0.01 + 0.035 + 1e-4 * tokens + late, replace(predicted, prefill_tokens=tokens, own_tokens=tokens)
        )
    assert model.s_per_token == pytest.approx(1e-4, rel=0.1)
    assert model.prefill_base_s == pytest.approx(0.035, abs=0.01)
    before = model.s_per_token
    model.observe_first_token(9.0, replace(predicted, slot_wait_s=1.0))  # a slot wait: not a rate
    model.observe_first_token(9.0, replace(predicted, prefill_tokens=2.0, own_tokens=2.0))  # too few tokens
    model.observe_first_token(9.0, replace(predicted, prefill_tokens=5000.0))  # mostly others' prompts: not its own
    assert model.s_per_token == before


def test_the_prefill_base_learned_from_its_own_predictions_is_the_servers() -> None:
    # The predictions carry the base the model had learned when it made them; what a first token teaches is the
    # base itself, not a correction of the one used (that fed back: the learned base settled near half the
    # server's, and every TTFT was predicted that much early).
    model = ServerModel(ctx())
    rest = 0.02  # the step and any wait: known to the prediction
    jitter = random.Random(7)
    for i in range(200):
        tokens = 20.0 + 50.0 * (i % 5)
        predicted = Estimate(
            ttft_s=rest + model.prefill_base_s + model.s_per_token * tokens, tpot_s=0.01, fixed_s=rest,
            prefill_tokens=tokens, speed=1.0, own_tokens=tokens,
        )  # fmt: skip
        actual = rest + 0.035 + 2e-4 * tokens + jitter.uniform(-0.004, 0.004)
        model.observe_first_token(actual, predicted)
    assert model.prefill_base_s == pytest.approx(0.035, rel=0.15)  # the line through 5 prompt sizes: not exact
    assert model.s_per_token == pytest.approx(2e-4, rel=0.2)


def test_prompts_alike_give_the_median_rate_through_the_origin() -> None:
    assert servermodel.resistant_line([(100.0, 0.1), (100.0, 0.2), (100.0, 5.0)]) == (pytest.approx(0.002), 0.0)


def test_an_adapter_that_cannot_load_waits_for_one_to_drain() -> None:
    model = ServerModel(ctx())
    loaded = endpoint(1, loras=("a",), max_loras=1)
    taken = endpoint(2, loras=("b",), max_loras=1)
    room = endpoint(3, loras=("b",), max_loras=2)
    found = model.estimate("a", 4.0, [10.0] * 3, [loaded, taken, room])
    assert found[0].ttft_s == found[2].ttft_s < found[1].ttft_s


def test_an_adapter_only_waiting_where_the_slots_are_taken_waits_a_whole_answer_of_the_running_one() -> None:
    model = ServerModel(ctx())
    model.observe_answer("a", 100)
    model.observe_answer("b", 100)
    waiting = endpoint(1, loras=("b",), waiting_loras=("a",), max_loras=1)  # "a" queued behind "b", not loaded
    free = endpoint(2, max_loras=1)
    at_waiting, at_free = model.estimate("a", 4.0, [10.0, 10.0], [waiting, free])
    step = at_free.tpot_s
    assert at_waiting.ttft_s - at_free.ttft_s == pytest.approx(100 * step)


def test_a_reported_queue_is_work_before_any_prompt_was_seen() -> None:
    model = ServerModel(ctx())
    pool = [endpoint(1, waiting=5), endpoint(2), endpoint(3, waiting=9)]
    five, idle, nine = model.estimate("m", 4.0, [12.0] * 3, pool)
    assert idle.ttft_s < five.ttft_s < nine.ttft_s


def test_speeds_are_relative_to_the_pool_and_small_swings_count_as_none() -> None:
    model = ServerModel(ctx())
    pool = [endpoint(i) for i in range(1, 5)]
    for e, speed in zip(pool, (0.6, 0.7, 0.8, 2.0), strict=True):  # the first three: noise; the last: 2.7x slower
        model._speed[e.key] = speed
    speeds = model.speeds(pool)
    assert speeds[:3] == [1.0, 1.0, 1.0]
    assert speeds[3] == pytest.approx(2.0 / 0.75)


def test_an_adapter_picker_routed_since_the_last_report_takes_the_slot() -> None:
    c = ctx()
    model = ServerModel(c)
    model.observe_reports([endpoint(9, loras=("b",), max_loras=1)])  # "b" is an adapter somewhere in the pool
    empty = endpoint(1, max_loras=1)  # reported no adapter loaded
    assert model.estimate("a", 4.0, [10.0], [empty])[0].slot_wait_s == 0.0
    before = model.estimate("a", 4.0, [10.0], [empty])[0].ttft_s
    c.inflight.acquire(empty.key, 20, c.clock(), prefill_tokens=10, model="b")  # picker just sent "b" there
    assert model.estimate("a", 4.0, [10.0], [empty])[0].ttft_s > before
    assert model.estimate("b", 4.0, [10.0], [empty])[0].ttft_s < model.estimate("a", 4.0, [10.0], [empty])[0].ttft_s


def test_before_anything_is_learned_fewer_requests_in_flight_is_cheaper() -> None:
    # No report, no answer yet: the first requests of a burst must not tie; each goes to the server with the
    # fewest of picker's requests in flight (picker's own are known at once, a scrape is 100 ms away).
    c = ctx()
    model = ServerModel(c)
    pool = [endpoint(1), endpoint(2), endpoint(3)]
    for server, held in zip(pool, (2, 0, 1), strict=True):
        for _ in range(held):
            c.inflight.acquire(server.key, 20, c.clock(), prefill_tokens=0)
    found = model.estimate("m", 4.0, [0.0] * 3, pool)
    assert found[1].ttft_s < found[2].ttft_s < found[0].ttft_s


def test_prompts_routed_earlier_have_been_partly_computed() -> None:
    c = ctx()
    model = ServerModel(c)
    server = endpoint(1)
    c.inflight.acquire(server.key, 5000, c.clock(), prefill_tokens=4000)
    at_once = model.estimate("m", 4.0, [100.0], [server])[0].prefill_tokens
    assert at_once == pytest.approx(4100.0)
    c.clock.advance(servermodel.DEFAULT_STEP_S)  # type: ignore[attr-defined]  # the step it joined has not ended
    assert model.estimate("m", 4.0, [100.0], [server])[0].prefill_tokens == pytest.approx(4100.0)
    c.clock.advance(4000 * servermodel.DEFAULT_S_PER_TOKEN / 2)  # type: ignore[attr-defined]
    assert model.estimate("m", 4.0, [100.0], [server])[0].prefill_tokens == pytest.approx(2100.0, rel=1e-3)
    c.clock.advance(1.0)  # type: ignore[attr-defined]
    assert model.estimate("m", 4.0, [100.0], [server])[0].prefill_tokens == pytest.approx(100.0)


def test_the_requests_arriving_behind_are_those_picker_sends_there() -> None:
    c = ctx()
    model = ServerModel(c)
    busy, quiet = endpoint(1), endpoint(2)
    for i in range(100):
        c.clock.advance(0.01)  # type: ignore[attr-defined]
        model.observe_arrival(c.clock(), busy.key if i % 10 else quiet.key)
    assert model.arrivals_per_s == pytest.approx(100.0)
    assert model.arrivals_at(busy.key) == pytest.approx(90.0, rel=0.1)
    assert model.arrivals_at(quiet.key) == pytest.approx(10.0, rel=0.3)
    assert model.arrivals_at(endpoint(3).key) == 0.0


def test_a_long_answer_taking_the_last_slot_delays_the_next_request_longer_than_a_short_one() -> None:
    c = ctx()
    model = ServerModel(c)
    _reports(model, (999.7, 999.8, 999.9), (1, 1, 2, 0.0))
    server = endpoint(1, running=1)  # one slot free of 2
    short, long = model.estimate("m", 4.0, [10.0], [server])[0], model.estimate("m", 512.0, [10.0], [server])[0]
    assert short.slot_wait_s == long.slot_wait_s == 0.0
    assert long.next_delay_s > short.next_delay_s


def _full_pool_with_arrivals(c: PluginContext, model: ServerModel, busy: Endpoint, quiet: Endpoint) -> None:
    """Both servers learned to run 2 sequences; picker sent 9 of 10 requests of the last second to ``busy``."""
    _reports(model, (999.7, 999.8, 999.9), (1, 1, 2, 0.0), (2, 1, 2, 0.0))
    for i in range(100):
        c.clock.advance(0.01)  # type: ignore[attr-defined]
        model.observe_arrival(c.clock(), quiet.key if i % 10 == 0 else busy.key)


def test_a_request_on_a_full_server_costs_the_requests_arriving_while_it_holds_its_slot() -> None:
    c = ctx()
    model = ServerModel(c)
    busy, quiet = endpoint(1, running=2, waiting=1), endpoint(2, running=2, waiting=1)
    _full_pool_with_arrivals(c, model, busy, quiet)
    short_busy, _ = model.estimate("m", 4.0, [10.0, 10.0], [busy, quiet])
    long_busy, long_quiet = model.estimate("m", 512.0, [10.0, 10.0], [busy, quiet])
    assert long_busy.ttft_s == pytest.approx(long_quiet.ttft_s)  # the same queue: only the arrivals differ
    # Each arrival while it is there (during its wait and its run) starts later by its run over the 2 slots
    run = 10.0 * model.s_per_token + 512.0 * long_busy.tpot_s
    expected = long_busy.arrivals_per_s * (long_busy.ttft_s + run) * run / 2
    assert long_busy.hold_s == pytest.approx(expected)
    assert long_busy.arrivals_per_s > 5 * long_quiet.arrivals_per_s
    assert long_busy.hold_s > 5 * long_quiet.hold_s > 0.0
    assert long_busy.hold_s > 50 * short_busy.hold_s > 0.0  # holding a slot for 4 tokens costs little
    # so a long answer goes where fewer requests arrive
    assert long_busy.cost_s(512.0) > long_quiet.cost_s(512.0) + long_busy.hold_s / 2


def test_a_server_with_room_for_the_next_request_charges_no_hold() -> None:
    c = ctx()
    model = ServerModel(c)
    busy, quiet = endpoint(1), endpoint(2)  # idle: 2 slots each, both free
    _full_pool_with_arrivals(c, model, busy, quiet)
    long_busy, _ = model.estimate("m", 512.0, [10.0, 10.0], [busy, quiet])
    assert long_busy.arrivals_per_s > 0.0
    assert long_busy.hold_s == 0.0


def test_a_slow_server_not_observed_lately_drifts_back_to_the_pools_pace() -> None:
    c = ctx()
    model = ServerModel(c)
    pool = [endpoint(i) for i in range(1, 4)]
    for _ in range(200):  # the fit learns a 20 ms step; server 3 runs its steps 4x slower
        for e in pool:
            model.observe_step(e.key, 4.0, 0.08 if e.key == pool[2].key else 0.02)
    assert model.speeds(pool)[2] > 2.0
    c.clock.advance(30.0)  # type: ignore[attr-defined]  # no request went there since: nothing says it is slow
    assert model.speeds(pool)[2] == 1.0


def test_a_server_that_recovered_is_believed_from_where_its_slowness_had_drifted_to() -> None:
    c = ctx()
    model = ServerModel(c)
    pool = [endpoint(i) for i in range(1, 4)]
    for _ in range(200):
        for e in pool:
            model.observe_step(e.key, 4.0, 0.08 if e.key == pool[2].key else 0.02)
    c.clock.advance(30.0)  # type: ignore[attr-defined]
    model.observe_step(pool[2].key, 4.0, 0.02)  # its first answer since: as fast as the rest
    c.clock.advance(1.0)  # type: ignore[attr-defined]
    assert model.speeds(pool)[2] == 1.0  # not pulled back to 4x by one fast answer after 30 s unseen


def _counting(i: int, at: float, running: int, generated: float, queried: float = 0.0, hits: float = 0.0) -> Endpoint:
    """Server ``i``'s report at ``at`` with its work counters."""
    e = endpoint(i, running=running, updated_at=at)
    work = {"generated_tokens": generated, "prefix_query_tokens": queried, "prefix_hit_tokens": hits}
    return replace(e, metrics=replace(e.metrics, **work))


def _pool_of_20ms_steps() -> tuple[PluginContext, ServerModel, list[Endpoint]]:
    """Three servers; the fit learned a 20 ms step at a batch of 4 from answers alike everywhere."""
    c = ctx()
    model = ServerModel(c)
    pool = [endpoint(i) for i in range(1, 4)]
    for _ in range(50):
        for e in pool:
            model.observe_step(e.key, 4.0, 0.02)
    return c, model, pool


def _seconds_of_work(
    model: ServerModel, clock: object, seconds: int, *per_s: tuple[float, float, float], running: int = 4
) -> None:
    """Reports once a second for ``seconds`` s: server i+1 adds ``per_s[i]`` (generated, queried, hits) a second."""
    for t in range(seconds + 1):
        if t:
            clock.advance(1.0)  # type: ignore[attr-defined]
        now = clock()  # type: ignore[operator]
        model.observe_reports([_counting(i + 1, now, running, *(t * x for x in work)) for i, work in enumerate(per_s)])


def test_work_counters_show_a_slow_server_before_any_answer_ends_there() -> None:
    c, model, pool = _pool_of_20ms_steps()
    assert model.speeds(pool) == [1.0, 1.0, 1.0]
    # Four sequences each: servers 1 and 2 emit 200 tokens a second (a 20 ms step), server 3 50 (an 80 ms step)
    _seconds_of_work(model, c.clock, 10, (200.0, 0.0, 0.0), (200.0, 0.0, 0.0), (50.0, 0.0, 0.0))
    speeds = model.speeds(pool)
    assert speeds[:2] == [1.0, 1.0]
    # 4x slower, believed most of the way after 10 s (half of the way every _SPEED_HALF_LIFE_S)
    assert 2.5 < speeds[2] < 4.0


def test_prompts_a_server_computed_explain_the_tokens_it_did_not_emit() -> None:
    c, model, pool = _pool_of_20ms_steps()
    model.s_per_token = 0.00075
    # Server 3 emits a quarter of the tokens, but computed 1,000 uncached prompt tokens a second (0.75 s of work)
    _seconds_of_work(model, c.clock, 10, (200.0, 0.0, 0.0), (200.0, 0.0, 0.0), (50.0, 3000.0, 2000.0))
    assert model.speeds(pool) == [1.0, 1.0, 1.0]


def test_a_window_with_a_queue_on_a_full_kv_cache_is_not_read() -> None:
    # vLLM counts a waiting request's prefix lookup at every step until it fits: the prompt counters overstate
    c, model, pool = _pool_of_20ms_steps()
    model.s_per_token = 0.00075
    key = pool[2].key
    for t in range(11):  # 200 tokens a second (the pool's pace) and 3,000 uncached prompt tokens "computed"
        e = _counting(3, c.clock(), 4, 200.0 * t, 3000.0 * t, 0.0)
        full = t % 2 == 0  # every other report: requests waiting on a full KV cache
        model.observe_reports([replace(e, metrics=replace(e.metrics, waiting=2 if full else 0, kv_usage=0.95))])
        c.clock.advance(1.0)  # type: ignore[attr-defined]
    before = model._speed[pool[0].key]
    assert model._speed[key] == before  # never read (it would have looked 3x faster than the pool)


def test_idle_time_and_restarts_are_no_work_to_measure_a_server_by() -> None:
    c, model, pool = _pool_of_20ms_steps()
    key = pool[2].key

    def report(running: int, generated: float) -> None:
        model.observe_reports([_counting(3, c.clock(), running, generated)])

    report(4, 0.0)
    c.clock.advance(0.5)
    report(0, 100.0)  # its requests ended; idle for 10 s
    c.clock.advance(10.0)
    report(4, 100.0)
    c.clock.advance(1.0)
    report(4, 300.0)  # 200 tokens in the second it ran: a 20 ms step
    c.clock.advance(1.0)
    report(4, 100.0)  # restarted: the counter went back (no negative work), a new window starts
    c.clock.advance(1.0)
    report(4, 300.0)  # one second of 20 ms steps again
    assert model.speeds(pool) == [1.0, 1.0, 1.0]
    assert model._speed[key] == pytest.approx(1.0, abs=0.01)


def test_a_first_token_long_overdue_shows_a_slow_server_before_any_answer_ends() -> None:
    c = ctx()
    model = ServerModel(c)
    pool = [endpoint(i) for i in range(1, 4)]
    now = c.clock()
    for e in pool:
        c.inflight.acquire(e.key, 20, now, prefill_tokens=10)
        model.expect_first_token(e.key, f"r-{e.key}", now, 0.1)
    c.clock.advance(0.12)  # type: ignore[attr-defined]  # a little late everywhere: the pool's pace
    assert model.speeds(pool) == [1.0, 1.0, 1.0]
    for e in pool[:2]:
        model.first_token_seen(e.key, f"r-{e.key}")
    c.clock.advance(0.3)  # type: ignore[attr-defined]  # server 3's first token is now 4x overdue
    assert model.speeds(pool)[:2] == [1.0, 1.0]
    assert model.speeds(pool)[2] == pytest.approx(4.2)
    model.first_token_seen(pool[2].key, f"r-{pool[2].key}")
    assert model.speeds(pool)[2] == 1.0


def _overdue_first_token_on_server_3(report: object) -> list[float]:
    """Server 3 reports twice a second (``report(at, t)`` builds its endpoint at ``at``, ``t`` seconds into its
    work) while picker's request there awaits a first token predicted in 50 ms for a second; what the model
    believes of the pool's speeds then (the server's counters read over one window by its end)."""
    c, model, pool = _pool_of_20ms_steps()
    key = pool[2].key
    model.observe_reports([report(c.clock(), 0.0)])  # type: ignore[operator]
    c.inflight.acquire(key, 20, c.clock(), prefill_tokens=10)
    model.expect_first_token(key, "r", c.clock(), 0.05)
    for t in (0.5, 1.0):
        c.clock.advance(0.5)  # type: ignore[attr-defined]
        model.observe_reports([report(c.clock(), t)])  # type: ignore[operator]
    return model.speeds(pool)


def test_a_late_first_token_where_the_counters_show_the_pace_is_no_slowness() -> None:
    # A cached prompt predicted in 50 ms waits behind another's long prefill: 20x late, on a server whose
    # counters show it working at the pool's pace. Its pace is the counters' to tell.
    working = _overdue_first_token_on_server_3(lambda at, t: _counting(3, at, 4, 200.0 * t))
    assert working == [1.0, 1.0, 1.0]


def test_before_a_window_of_its_counters_is_read_a_first_token_is_late_against_a_second_at_least() -> None:
    c, model, pool = _pool_of_20ms_steps()
    key = pool[2].key
    model.observe_reports([_counting(3, c.clock(), 4, 0.0)])
    c.inflight.acquire(key, 20, c.clock(), prefill_tokens=10)
    model.expect_first_token(key, "r", c.clock(), 0.05)
    c.clock.advance(0.5)  # type: ignore[attr-defined]
    model.observe_reports([_counting(3, c.clock(), 4, 5.0)])  # it works (a 100x slower step), no window read yet
    assert model.speeds(pool)[2] == 1.0  # 10x its prediction, but half a second: a short prediction's miss
    c.clock.advance(2.5)  # type: ignore[attr-defined]  # still no first token after 3 s: 3x a second
    assert model.speeds(pool)[2] == pytest.approx(3.0)


def test_a_late_first_token_where_the_counters_stopped_or_cannot_be_read_is_a_stall() -> None:
    stalled = _overdue_first_token_on_server_3(lambda at, t: _counting(3, at, 4, 200.0))
    assert stalled[:2] == [1.0, 1.0]
    assert stalled[2] == servermodel._MAX_SPEED

    def kv_bound(at: float, t: float) -> Endpoint:  # working, but queueing on a full KV cache: not read
        e = _counting(3, at, 4, 200.0 * t)
        return replace(e, metrics=replace(e.metrics, waiting=2, kv_usage=0.95))

    assert _overdue_first_token_on_server_3(kv_bound)[2] == servermodel._MAX_SPEED


def test_a_request_that_ended_without_a_first_token_is_not_overdue() -> None:
    c = ctx()
    model = ServerModel(c)
    e = endpoint(1)
    lease = c.inflight.acquire(e.key, 20, c.clock(), prefill_tokens=10)
    model.expect_first_token(e.key, "r", c.clock(), 0.1)
    c.inflight.release(lease)
    c.clock.advance(5.0)  # type: ignore[attr-defined]
    assert model.speeds([e, endpoint(2), endpoint(3)]) == [1.0, 1.0, 1.0]


def test_first_tokens_late_everywhere_say_nothing_of_any_server() -> None:
    c = ctx()
    model = ServerModel(c)
    pool = [endpoint(i) for i in range(1, 4)]
    for e in pool:
        c.inflight.acquire(e.key, 20, c.clock(), prefill_tokens=10)
        model.expect_first_token(e.key, f"r-{e.key}", c.clock(), 0.1)
    c.clock.advance(0.4)  # type: ignore[attr-defined]  # 4x late on every server: a queue the model missed
    assert model.speeds(pool) == [1.0, 1.0, 1.0]


def test_requests_picker_did_not_route_scale_the_arrivals_it_expects() -> None:
    c = ctx()
    model = ServerModel(c)
    alone, shared = endpoint(1), endpoint(2, running=6)  # the second reports 6 running: 5 beside picker's one
    for _ in range(10):
        c.clock.advance(0.1)  # type: ignore[attr-defined]
        model.observe_arrival(c.clock(), alone.key)
    rate = model.arrivals_at(alone.key)
    for key in (alone.key, shared.key):
        c.inflight.acquire(key, 20, c.clock(), prefill_tokens=10)
    assert rate > 0.0
    # picker's requests are all there is
    assert model.estimate("m", 4.0, [10.0], [alone])[0].arrivals_per_s == pytest.approx(rate)
    # 7 in flight, 2 of them picker's: 3.5x picker's arrivals
    found = model.estimate("m", 4.0, [10.0, 10.0], [alone, shared])
    assert found[0].arrivals_per_s == pytest.approx(3.5 * rate)
    assert model.arrivals_at(alone.key) == pytest.approx(rate)  # picker's own, as before


def _running_as_built(
    model: ServerModel, leases: list[Lease], others_running: float, step: float, s_tok: float, prompt: float,
    answer: float, now: float,
) -> tuple[Demand, ...]:  # fmt: skip
    """The running requests as ``_start_wait`` lays them out when it builds its queue (all have a slot)."""
    running = []
    for lease in leases:
        theirs = answer_tokens(lease.max_output_tokens, lease.fixed_output, model.mean_answer(lease.model))
        if lease.first_token_at is None:
            running.append(Demand(lease.prefill_tokens * s_tok + theirs * step, lease.prefill_tokens))
        else:
            done = (now - lease.first_token_at) / step
            running.append(Demand(max(step, (theirs - done) * step), lease.prefill_tokens + min(done, theirs)))
    n = round(others_running)
    for i in range(n):
        left = (i + 1) / (n + 1)
        running.append(Demand(answer * step * left, prompt + answer * (1.0 - left)))
    return tuple(running)


def test_with_a_slot_for_everyone_the_wait_is_the_built_queues_even_at_the_kv_limit() -> None:
    # Where every request has a slot, _start_wait answers without building the queue; at and around the KV
    # cache's limit its answer must be the one the queue gives (the same sum, in the same order).
    rng = random.Random(3)
    for _ in range(300):
        c = ctx()
        model = ServerModel(c)
        key = "10.0.0.1:8000"
        for _ in range(rng.randrange(0, 5)):
            lease = c.inflight.acquire(key, 10, c.clock(), prefill_tokens=rng.randrange(1, 900),
                                       max_output_tokens=rng.choice((0, 64, 512)), fixed_output=rng.random() < 0.5,
                                       model="m")  # fmt: skip
            if rng.random() < 0.5:
                c.inflight.prefilled(lease, lease.prefill_tokens, c.clock())
            c.clock.advance(rng.random() * 0.05)  # type: ignore[attr-defined]
        leases = list(c.inflight.leases(key))
        others, step, s_tok, prompt, answer = rng.randrange(0, 4), 0.02, 1e-4, rng.uniform(50, 500), 128.0
        ours = Demand(0.5, rng.uniform(10, 900))
        built = _running_as_built(model, leases, others, step, s_tok, prompt, answer, c.clock())
        used = sum(d.kv_tokens for d in built)
        for kv in (used + ours.kv_tokens + prompt, used + ours.kv_tokens, used + ours.kv_tokens + prompt - 1e-6):
            expected = servermodel.start_waits_s(built, (ours, Demand(answer * step, prompt)), 64, kv)
            got = model._start_wait(leases, others, 0.0, ours, 64, kv, step, s_tok, prompt, answer, c.clock())
            assert got == (expected[-2], expected[-1])
