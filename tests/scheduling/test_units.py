"""Go durations and Kubernetes quantities, and the flags spelled like them."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

import pytest

from picker.scheduling.units import above, at_least, bool_arg, duration_arg, duration_s, fraction, port_arg, quantity


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


def test_number_flags_take_their_kind_within_their_range() -> None:
    assert at_least(1)("3") == 3
    assert type(at_least(1)("3")) is int
    assert at_least(0.0, float)("0") == 0.0
    assert above(0)("0.5") == 0.5
    assert fraction("1") == 1.0


@pytest.mark.parametrize(
    ("parse", "text", "says"),
    [
        (at_least(1), "0", "'0': at least 1"),
        (at_least(1), "1.5", "'1.5' is not an integer"),
        (at_least(0.0, float), "-0.1", "at least 0"),
        (above(0), "0", "'0': above 0"),
        (above(0), "x", "'x' is not a number"),
        (above(0), "inf", "not a finite number"),
        (fraction, "1.01", "a share from 0 to 1"),
        (fraction, "nan", "not a finite number"),
        (port_arg, "65536", "a port is 0 to 65535"),
        (port_arg, "http", "is not a port number"),
    ],
)
def test_number_flags_refuse_what_is_out_of_range_as_a_usage_error(
    parse: Callable[[str], object], text: str, says: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(says)):
        parse(text)
