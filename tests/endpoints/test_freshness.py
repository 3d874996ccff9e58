from __future__ import annotations

import pytest

from picker.endpoints.freshness import Change, FreshnessTracker, Transition
from picker.settings import ScrapeSettings
from tests.conftest import FakeClock

A = "10.0.0.1:8000"
B = "10.0.0.2:8000"


def tracker(clock: FakeClock, **kw: float) -> FreshnessTracker:
    settings = ScrapeSettings(**kw)  # type: ignore[arg-type]
    t = FreshnessTracker.from_settings(settings, clock)
    t.sync([A, B])
    return t


def changes(transitions: list[Transition]) -> list[Change]:
    return [t.change for t in transitions]


def test_excluded_after_fail_threshold_consecutive_failures(clock: FakeClock) -> None:
    t = tracker(clock, fail_threshold=3)
    assert changes(t.failure(A, "http", "HTTP 500")) == [Change.FAILING]
    assert t.failure(A, "http", "HTTP 500") == []
    assert not t.is_excluded(A)
    out = t.failure(A, "http", "HTTP 500")
    assert changes(out) == [Change.EXCLUDED]
    assert out[0].reason == "failing"
    assert "HTTP 500" in out[0].detail
    assert t.is_excluded(A)
    assert not t.is_excluded(B)
    assert t.failure(A, "http", "HTTP 500") == []  # once per transition


def test_a_success_resets_the_failure_count(clock: FakeClock) -> None:
    t = tracker(clock, fail_threshold=3)
    t.failure(A)
    t.failure(A)
    assert changes(t.success(A)) == [Change.OK]
    t.failure(A)
    t.failure(A)
    assert not t.is_excluded(A)


def test_readmitted_after_recover_threshold_good_polls(clock: FakeClock) -> None:
    t = tracker(clock, fail_threshold=1, recover_threshold=3)
    assert changes(t.failure(A)) == [Change.FAILING, Change.EXCLUDED]
    assert changes(t.success(A)) == [Change.OK]
    assert t.success(A) == []
    assert t.is_excluded(A)
    t.failure(A)  # a relapse restarts the count
    t.success(A)
    t.success(A)
    assert t.is_excluded(A)
    out = t.success(A)
    assert changes(out) == [Change.READMITTED]
    assert not t.is_excluded(A)


def test_stale_when_no_good_poll_within_staleness(clock: FakeClock) -> None:
    t = tracker(clock, staleness_s=2.0)
    t.success(A)
    clock.advance(1.5)
    t.success(B)
    clock.advance(0.6)  # A: 2.1 s, B: 0.6 s
    out = t.check()
    assert [(x.key, x.change, x.reason) for x in out] == [(A, Change.EXCLUDED, "stale")]
    assert t.check() == []  # once per transition
    assert t.age_s(A) == pytest.approx(2.1)


def test_stale_exclusion_needs_full_recovery_despite_earlier_successes(clock: FakeClock) -> None:
    t = tracker(clock, staleness_s=1.0, recover_threshold=2)
    t.sync([A])
    for _ in range(5):
        t.success(A)
    clock.advance(1.5)  # polls hang: neither success nor failure arrives
    assert changes(t.check()) == [Change.EXCLUDED]
    assert t.success(A) == []  # one good poll is not enough
    assert changes(t.success(A)) == [Change.READMITTED]
    clock.advance(0.5)
    assert t.check() == []


def test_new_endpoints_start_admitted_and_age_from_tracking(clock: FakeClock) -> None:
    t = tracker(clock, staleness_s=2.0)
    clock.advance(1.0)
    t.sync([A, B, "10.0.0.3:8000"])
    assert not t.is_excluded("10.0.0.3:8000")
    clock.advance(1.5)
    stale = {x.key for x in t.check()}
    assert stale == {A, B}  # never scraped for 2.5 s; the new one only 1.5 s


def test_sync_forgets_removed_endpoints(clock: FakeClock) -> None:
    t = tracker(clock, fail_threshold=1)
    t.failure(A)
    assert t.sync([B]) == [A]
    assert not t.is_excluded(A)
    assert t.failure(A) == []  # untracked keys are ignored
    assert t.success(A) == []
    assert t.age_s(A) is None
    t.sync([A, B])
    assert not t.is_excluded(A)  # re-added fresh
    assert t.failures(A) == 0


def test_untracked_endpoints_are_never_excluded(clock: FakeClock) -> None:
    t = tracker(clock, staleness_s=0.5)
    clock.advance(10)
    assert "10.9.9.9:8000" not in {x.key for x in t.check()}
    assert not t.is_excluded("10.9.9.9:8000")


@pytest.mark.parametrize("kw", [{"fail_threshold": 0}, {"recover_threshold": 0}, {"staleness_s": 0.0}])
def test_bad_thresholds_raise(clock: FakeClock, kw: dict[str, float]) -> None:
    args: dict[str, float] = {"fail_threshold": 3, "recover_threshold": 2, "staleness_s": 2.0} | kw
    with pytest.raises(ValueError, match="must be"):
        FreshnessTracker(
            fail_threshold=int(args["fail_threshold"]),
            recover_threshold=int(args["recover_threshold"]),
            staleness_s=args["staleness_s"],
            clock=clock,
        )


def test_a_refused_connection_excludes_at_the_first_failure() -> None:
    from picker.endpoints.freshness import REFUSED, Change, FreshnessTracker

    tracker = FreshnessTracker(fail_threshold=3, recover_threshold=2, staleness_s=2.0, clock=lambda: 0.0)
    tracker.sync(["a", "b"])
    assert [t.change for t in tracker.failure("a", REFUSED, "refused")] == [Change.FAILING, Change.EXCLUDED]
    assert [t.change for t in tracker.failure("b", "timeout", "slow")] == [Change.FAILING]
    assert tracker.is_excluded("a")
    assert not tracker.is_excluded("b")
