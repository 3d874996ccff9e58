"""Go durations and Kubernetes quantities, and the flags spelled like them."""

from __future__ import annotations

import argparse

import pytest

from picker.scheduling.units import bool_arg, duration_arg, duration_s, quantity


@pytest.mark.parametrize(
    ("text", "seconds"), [("200ms", 0.2), ("1m30s", 90.0), ("0s", 0.0), ("2", 2.0), (1.5, 1.5), ("1h", 3600.0)]
)
def test_durations(text: object, seconds: float) -> None:
    assert duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["soon", "5 ms", "-1s", -2, True, None, "1s2"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        duration_s(bad)


@pytest.mark.parametrize(
    ("text", "amount"),
    [("1Gi", 2**30), ("500M", 500_000_000), ("1k", 1000), ("1000", 1000), (4096, 4096), ("0", 0), ("1e3", 1000)],
)
def test_quantities(text: object, amount: int) -> None:
    assert quantity(text) == amount


@pytest.mark.parametrize("bad", ["lots", "1GB", "-1", False, None])
def test_bad_quantities(bad: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        quantity(bad)


@pytest.mark.parametrize(
    ("text", "value"),
    [("true", True), (" Yes", True), ("ON", True), ("1", True), ("false", False), ("no", False), ("Off ", False),
     ("0", False)],
)  # fmt: skip
def test_bool_arg_reads_the_usual_spellings(text: str, value: bool) -> None:
    assert bool_arg(text) is value


@pytest.mark.parametrize("text", ["", "maybe", "2", "truee"])
def test_bool_arg_refuses_others_as_a_usage_error(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="is not true or false"):
        bool_arg(text)


def test_duration_arg_is_duration_s_with_a_usage_error() -> None:
    assert duration_arg("1m30s") == 90.0
    with pytest.raises(argparse.ArgumentTypeError, match="is not a duration like"):
        duration_arg("5x")
