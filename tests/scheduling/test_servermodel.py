"""The server model: slot waits, answer lengths, the step-time fit, learned capacity, prefill rate."""

from __future__ import annotations

import dataclasses

import pytest

from picker.scheduling import servermodel
from picker.scheduling.servermodel import Estimate, ServerModel, StepFit, answer_tokens, slot_wait_s
from tests.conftest import endpoint
from tests.scheduling.helpers import ctx


def test_a_free_slot_means_no_wait() -> None:
    assert slot_wait_s([5.0, 1.0], [], capacity=3) == 0.0


def test_a_full_server_frees_its_soonest_slot_first() -> None:
    assert slot_wait_s([5.0, 1.0, 3.0], [], capacity=3) == 1.0


def test_requests_queued_ahead_take_the_slots_that_free_first() -> None:
    # The first queued request takes the slot free at 1 s and holds it 2 s more (until 3 s); ours gets the next
    # slot to free: 3 s (the one that was running, or the queued one's: both at 3 s).
    assert slot_wait_s([5.0, 1.0, 3.0], [2.0], capacity=3) == 3.0
    assert slot_wait_s([5.0, 1.0, 3.0], [2.0, 10.0], capacity=3) == 3.0
    assert slot_wait_s([5.0, 1.0, 3.0], [2.0, 10.0, 0.5], capacity=3) == 3.5


@pytest.mark.parametrize(
    ("max_tokens", "fixed", "mean", "expected"),
    [(512, True, 40.0, 512.0), (512, False, 40.0, 40.0), (16, False, 40.0, 16.0), (0, False, 40.0, 40.0)],
)
def test_answer_length(max_tokens: int, fixed: bool, mean: float, expected: float) -> None:
    assert answer_tokens(max_tokens, fixed, mean) == expected


def test_the_step_fit_recovers_a_line_through_the_batches_seen() -> None:
    fit = StepFit()
    assert fit.coefficients() == (servermodel.DEFAULT_STEP_S, 0.0)
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
    assert fit.coefficients() == pytest.approx((0.05, 0.0))


def test_capacity_is_what_a_server_ran_while_others_waited() -> None:
    model = ServerModel(ctx())
    full, idle, stale = endpoint(1, waiting=3, running=16), endpoint(2, running=5), endpoint(3, waiting=2, running=30)
    stale = dataclasses.replace(stale, metrics=dataclasses.replace(stale.metrics, updated_at=1.0))
    assert model.capacity(idle.key) == 0  # nothing learned: no limit
    model.observe_reports([full, idle, stale])
    assert model.capacity(full.key) == 16
    assert model.capacity(idle.key) == 16  # never seen full: the pool's
    assert model.capacity(stale.key) == 16  # a stale report teaches nothing
    model.observe_reports([endpoint(1, waiting=1, running=12)])
    assert model.capacity(full.key) == 16  # the most it ran, not the last


def test_a_full_server_of_long_answers_waits_longer_than_one_of_short_answers() -> None:
    c = ctx()
    model = ServerModel(c)
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


def test_the_prefill_rate_is_the_median_of_what_first_tokens_showed() -> None:
    model = ServerModel(ctx())
    predicted = Estimate(ttft_s=0.0, tpot_s=0.01, fixed_s=0.01, prefill_tokens=100.0, speed=1.0)
    for ttft in (0.11, 0.21, 5.0):  # 1 ms, 2 ms, 50 ms per token: the median is 2 ms
        model.observe_first_token(ttft, predicted)
    assert model.s_per_token == pytest.approx(0.002)
    model.observe_first_token(9.0, dataclasses.replace(predicted, slot_wait_s=1.0))  # a slot wait: not a rate
    model.observe_first_token(9.0, dataclasses.replace(predicted, prefill_tokens=2.0))  # too few tokens
    assert model.s_per_token == pytest.approx(0.002)


def test_an_adapter_that_cannot_load_waits_for_one_to_drain() -> None:
    model = ServerModel(ctx())
    loaded = endpoint(1, loras=("a",), max_loras=1)
    taken = endpoint(2, loras=("b",), max_loras=1)
    room = endpoint(3, loras=("b",), max_loras=2)
    found = model.estimate("a", 4.0, [10.0] * 3, [loaded, taken, room])
    assert found[0].ttft_s == found[2].ttft_s < found[1].ttft_s
