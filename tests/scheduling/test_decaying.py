"""DecayingCounts: counts that lose half their weight every half-life."""

from __future__ import annotations

import pytest

from picker.scheduling.decaying import DecayingCounts, RecentShare
from tests.conftest import FakeClock


def test_counts_halve_every_half_life_and_add_up() -> None:
    clock = FakeClock()
    counts = DecayingCounts(10.0, clock)
    counts.add("a", 8.0)
    assert counts.get("a") == 8.0
    assert counts.get("b") == 0.0
    clock.advance(10.0)
    assert counts.get("a") == pytest.approx(4.0)
    counts.add("a", 1.0)
    clock.advance(20.0)
    assert counts.get("a") == pytest.approx(5.0 / 4)


def test_retain_forgets_other_keys() -> None:
    counts = DecayingCounts(10.0, FakeClock())
    counts.add("a", 1.0)
    counts.add("b", 2.0)
    counts.retain(["b"])
    assert (counts.get("a"), counts.get("b")) == (0.0, 2.0)


def test_half_life_must_be_positive() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        DecayingCounts(0.0, FakeClock())


def test_recent_share_is_a_moving_average_over_about_one_over_weight_events() -> None:
    share = RecentShare(0.5)
    assert share.value == 0.0
    assert [share.add(True), share.add(True), share.add(False)] == [0.5, 0.75, 0.375]
    with pytest.raises(ValueError, match="weight"):
        RecentShare(0.0)


def test_recent_share_can_start_whole_and_count_part_of_an_event() -> None:
    share = RecentShare(0.5, start=1.0)
    assert share.value == 1.0
    assert [share.add(0.0), share.add(0.5), share.add(True)] == [0.5, 0.5, 0.75]
    with pytest.raises(ValueError, match="start"):
        RecentShare(0.5, start=1.5)
