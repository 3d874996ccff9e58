"""Outlier detection: consecutive 5xx eject, successes reset, ejections end and grow, at most half the pool."""

from __future__ import annotations

from picker.endpoints.outliers import OutlierDetector, OutlierSettings


def test_five_consecutive_5xx_eject_for_the_base_time_then_longer_each_time() -> None:
    det = OutlierDetector(OutlierSettings(consecutive_5xx=5, base_ejection_s=10.0))
    for _ in range(4):
        assert not det.record("a", 500, 0.0, pool_size=3)
    assert det.record("a", 503, 0.0, pool_size=3)
    assert det.ejected() == {"a"}
    assert det.readmit_due(9.9) == []
    assert det.readmit_due(10.0) == ["a"]
    assert det.ejected() == frozenset()
    for _ in range(5):
        det.record("a", 502, 20.0, pool_size=3)
    assert det.readmit_due(39.0) == []  # second ejection: 2 x 10 s
    assert det.readmit_due(40.0) == ["a"]


def test_a_success_or_a_4xx_resets_the_count_and_none_is_ignored() -> None:
    det = OutlierDetector()
    for status in (500, 500, 500, 500, 200, 500, 500, 500, 500, 429, 500, None, 500, 500, 500):
        assert not det.record("a", status, 0.0, pool_size=2)
    assert det.ejected() == frozenset()


def test_at_most_half_the_pool_is_ejected_but_always_one() -> None:
    det = OutlierDetector()
    for key in ("a", "b", "c"):
        for _ in range(5):
            det.record(key, 500, 0.0, pool_size=4)
    assert det.ejected() == {"a", "b"}
    solo = OutlierDetector()
    for _ in range(5):
        solo.record("a", 500, 0.0, pool_size=1)
    assert solo.ejected() == {"a"}  # candidates() still falls back to it: nothing else is left


def test_forget_drops_endpoints_that_left() -> None:
    det = OutlierDetector()
    for _ in range(5):
        det.record("a", 500, 0.0, pool_size=2)
    det.forget_except(["b"])
    assert det.ejected() == frozenset()
