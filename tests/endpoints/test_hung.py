"""Hung-server detection: overdue first answers with no answer since make a server suspect; any answer clears it."""

from __future__ import annotations

import pytest

from picker.endpoints.hung import HungDetector, HungSettings, nominal_s

A, B, C = "10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"
POOL = (A, B, C)
SHORT = nominal_s(20, 8, whole_response=True)  # a short non-streamed request: ~0.21 s nominal


class Requests:
    """Distinct request handles, as the director's ``Routed`` objects are."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def warmed(seconds: float = 0.2) -> tuple[HungDetector, Requests, float]:
    """Every server of the pool answered a few short requests in ``seconds`` each; the time after that."""
    det, req, now = HungDetector(), Requests(), 0.0
    for key in POOL:
        for _ in range(4):
            r = req()
            det.watch(key, r, now, SHORT)
            assert det.answered(key, r, now + seconds) is None
    now += seconds
    det.check(now, POOL)
    return det, req, now


def suspect_after(det: HungDetector, start: float, step: float = 0.01, until: float = 30.0) -> float | None:
    """Seconds from ``start`` until the first check that suspects anything (None: nothing until ``until``)."""
    t = start
    while t - start < until:
        t += step
        if any(c.suspect for c in det.check(t, POOL)):
            return t - start
    return None


def test_a_silent_server_is_suspect_after_a_few_times_its_usual_answer_time() -> None:
    det, req, now = warmed(0.4)
    det.watch(A, req(), now, SHORT)
    after = suspect_after(det, now)
    # the usual 0.4 s, x2
    assert after == pytest.approx(0.4 * HungSettings().multiplier, abs=0.02)
    assert det.suspect() == {A}


def test_the_floor_holds_for_a_very_fast_pool() -> None:
    det, req, now = warmed(0.01)
    det.watch(A, req(), now, SHORT)
    assert suspect_after(det, now) == pytest.approx(HungSettings().min_overdue_s, abs=0.02)


def test_a_fresh_pool_waits_the_cold_deadline() -> None:
    det, req = HungDetector(), Requests()
    det.watch(A, req(), 0.0, SHORT)
    assert suspect_after(det, 0.0) == pytest.approx(HungSettings().cold_overdue_s, abs=0.02)


def test_a_server_without_answers_of_its_own_is_held_to_the_pool_reference() -> None:
    det, req, now = warmed(0.4)
    new = "10.0.0.9:8000"
    det.watch(new, req(), now, SHORT)
    t, found = now, False
    while t < now + 2.0 and not found:
        t += 0.01
        found = any(c.suspect for c in det.check(t, (*POOL, new)))
    assert found
    assert t - now == pytest.approx(0.4 * HungSettings().multiplier, abs=0.02)


def test_a_long_prompt_gets_a_deadline_to_its_size() -> None:
    det, req, now = warmed(0.2)
    long_prompt = nominal_s(32_000, 8, whole_response=True)
    det.watch(A, req(), now, long_prompt)
    after = suspect_after(det, now)
    assert after is not None
    assert after > 5.0  # 32 000 tokens at the pool's pace, x2 (a short one: 0.4 s)


def test_a_busy_server_that_keeps_answering_others_is_never_suspect() -> None:
    det, req, now = warmed(0.2)
    stuck = req()
    det.watch(A, stuck, now, SHORT)  # waits in a long queue
    for i in range(100):  # the server answers other requests all along, every 0.1 s
        t = now + 0.1 * (i + 1)
        r = req()
        det.watch(A, r, t - 0.05, SHORT)
        det.answered(A, r, t)
        assert not det.check(t, POOL)
    assert det.suspect() == frozenset()


def test_a_streamed_chunk_is_a_sign_of_life() -> None:
    det, req, now = warmed(0.2)
    det.watch(A, req(), now, SHORT)
    for i in range(50):
        t = now + 0.1 * (i + 1)
        det.alive(A, t)  # another request's tokens keep coming
        assert not det.check(t, POOL)


def test_a_suspect_server_comes_back_at_its_next_answer() -> None:
    det, req, now = warmed(0.2)
    r = req()
    det.watch(A, r, now, SHORT)
    assert suspect_after(det, now) is not None
    change = det.answered(A, r, now + 1.5)
    assert change is not None
    assert not change.suspect
    assert det.suspect() == frozenset()


def test_a_gateway_error_ends_the_wait_but_is_no_sign_of_life() -> None:
    det, req, now = warmed(0.2)
    r1, r2 = req(), req()
    det.watch(A, r1, now, SHORT)
    det.watch(A, r2, now, SHORT)
    assert suspect_after(det, now) is not None
    assert det.answered(A, r1, now + 1.0, alive=False) is None
    assert det.suspect() == {A}


def test_a_request_given_up_is_no_longer_waited_for() -> None:
    det, req, now = warmed(0.2)
    r = req()
    det.watch(A, r, now, SHORT)
    det.done(A, r)  # the client went away before the deadline
    assert suspect_after(det, now, until=5.0) is None
    assert det.pending() == 0


def test_a_silent_server_is_readmitted_on_probation_with_a_growing_hold() -> None:
    settings = HungSettings(probe_after_s=2.0)
    det, req = HungDetector(settings), Requests()
    for key in POOL:
        r = req()
        det.watch(key, r, 0.0, SHORT)
        det.answered(key, r, 0.2)
    r = req()
    det.watch(A, r, 1.0, SHORT)
    began = suspect_after(det, 1.0)
    assert began is not None
    t = 1.0 + began
    assert not det.check(t + 1.9, POOL)  # still overdue: no probation while its requests wait
    det.done(A, r)  # the client gave up
    changes = det.check(t + 2.01, POOL)
    assert [(c.key, c.suspect) for c in changes] == [(A, False)]
    # The probe: the next request it gets goes unanswered too. Suspect again, held twice as long.
    det.watch(A, req(), t + 2.0, SHORT)
    again = suspect_after(det, t + 2.0)
    assert again is not None
    t2 = t + 2.0 + again
    det.done(A, r + 1)
    assert not det.check(t2 + 3.9, POOL)
    assert [c.suspect for c in det.check(t2 + 4.01, POOL)] == [False]


def test_at_most_half_the_pool_is_suspect() -> None:
    det, req, now = warmed(0.2)
    for key in POOL:
        det.watch(key, req(), now, SHORT)
    assert suspect_after(det, now) is not None
    det.check(now + 5.0, POOL)
    assert len(det.suspect()) == 1  # int(3 * 0.5)


def test_a_late_answer_raises_the_reference_only_boundedly() -> None:
    det, req, now = warmed(0.2)
    before = det.deadline_s(A, SHORT)
    r = req()
    det.watch(A, r, now, SHORT)
    det.answered(A, r, now + 60.0)  # answered a minute late, after a pause
    assert det.deadline_s(A, SHORT) <= HungSettings().multiplier * before + 1e-9


def test_a_server_that_left_the_pool_is_forgotten() -> None:
    det, req, now = warmed(0.2)
    det.watch(A, req(), now, SHORT)
    assert suspect_after(det, now) is not None
    changes = det.check(now + 2.0, (B, C))
    assert [(c.key, c.suspect) for c in changes] == [(A, False)]
    assert det.suspect() == frozenset()
    assert det.pending() == 0


def busy(
    det: HungDetector, req: Requests, key: str, start: float, until: float, *, every: float, takes: float
) -> float:
    """Open-loop traffic to ``key``: a request every ``every`` s, each answered ``takes`` s after it was sent, the
    last sent before ``until``; checks as the director's task does. The time of the last answer."""
    answers: list[tuple[float, int]] = []
    t, last = start, start
    while t < until:
        r = req()
        det.watch(key, r, t, SHORT)
        answers.append((t + takes, r))
        t += every
    for at, r in answers:
        det.answered(key, r, at)
        assert not any(c.suspect for c in det.check(at, POOL))
        last = at
    return last


def stops_with_three_on_it(settings: HungSettings | None = None) -> tuple[HungDetector, float, float]:
    """A server answering every 0.07 s, each request 0.21 s after it was sent (three on it at any time), stops
    with three on it and keeps getting requests (sent after its last answer) until suspect: the detector, the
    time from the stop until suspect, and the deadline of a request."""
    det, req, _ = warmed(0.21)
    if settings is not None:
        det.settings = settings
    stop = busy(det, req, A, 1.0, 4.0, every=0.07, takes=0.21)
    for i in range(3):
        det.watch(A, req(), stop - 0.2 + 0.07 * i, SHORT)
    t = stop
    while t < stop + 2.0:
        det.watch(A, req(), t + 0.01, SHORT)
        t += 0.01
        if any(c.suspect for c in det.check(t, POOL)):
            return det, t - stop, det.deadline_s(A, SHORT)
    raise AssertionError("never suspect")


def test_a_server_that_stops_with_requests_on_it_is_suspect_once_the_oldest_is_overdue() -> None:
    _, after, deadline = stops_with_three_on_it()
    assert deadline == pytest.approx(0.42, abs=0.01)
    # The oldest one on it (sent 0.2 s before the stop) is overdue 0.2 s before the first request sent after
    # the server's last answer could be.
    assert after <= deadline - 0.2 + 0.02


def test_two_requests_late_in_a_long_silence_are_evidence_enough() -> None:
    # A silence limit of 2 x its 0.07 s pace: by then two of the three on it are past the 0.21 s their size
    # usually takes; the oldest is overdue only at 0.22 s.
    _, after, deadline = stops_with_three_on_it(HungSettings(min_silence_s=0.1))
    assert after == pytest.approx(0.14, abs=0.02)
    assert after < deadline - 0.2 - 0.05


def test_one_request_late_in_a_long_silence_waits_for_its_deadline() -> None:
    # A busy server finishes its other requests, then works on one that takes 1.9 x what its size usually does:
    # silent far past its pace, one request past its usual time; not suspect before it answers, in its deadline.
    det, req, _ = warmed(0.21)
    det.settings = HungSettings(min_silence_s=0.1)
    stop = busy(det, req, A, 1.0, 4.0, every=0.07, takes=0.21)
    big = req()
    det.watch(A, big, stop - 0.1, SHORT)
    answer_at = stop - 0.1 + 1.9 * 0.21
    assert answer_at < stop - 0.1 + det.deadline_s(A, SHORT)
    assert suspect_after(det, stop, until=answer_at - stop - 0.01) is None
    det.answered(A, big, answer_at)
    assert det.suspect() == frozenset()


def test_a_busy_server_pausing_within_its_usual_pace_is_not_suspect() -> None:
    # First answers every 0.1 s, sometimes 0.25 s apart, with a request queued long past its deadline all along.
    det, req, now = warmed(0.2)
    queued = req()
    det.watch(A, queued, now, SHORT)
    t = now
    for i in range(200):
        t += 0.25 if i % 10 == 0 else 0.1
        r = req()
        det.watch(A, r, t - 0.05, SHORT)
        det.answered(A, r, t)
        assert not det.check(t, POOL)
    # A pause of twice its longest spacing, minus a little: still not suspect.
    assert suspect_after(det, t, until=0.49) is None
    # Silent longer than that, with the queued request overdue: suspect.
    assert suspect_after(det, t + 0.49, until=0.05) is not None


def test_a_streaming_server_stalling_for_a_step_is_not_suspect() -> None:
    # Streams send a chunk every 20 ms; the first tokens of queued requests come 0.8 s apart, and one request waits
    # far past its deadline for a slot. An engine step of 0.3 s (a long prefill) stalls every stream: a silence
    # 15 x the chunks' spacing, but well within the first tokens' one, which alone sets the silence limit.
    det, req, now = warmed(0.2)
    queued = req()
    det.watch(A, queued, now, SHORT)
    t = now
    for i in range(1, 401):
        t += 0.02
        if i % 40 == 0:
            r = req()
            det.watch(A, r, t - 0.1, SHORT)
            det.answered(A, r, t)
        else:
            det.alive(A, t)
        assert not det.check(t, POOL)
    stall_end = t + 0.3
    while t < stall_end - 0.005:
        t += 0.01
        assert not det.check(t, POOL)
    det.alive(A, stall_end)
    assert det.suspect() == frozenset()
