"""Go durations and Kubernetes quantities."""

from __future__ import annotations

import pytest

from picker.scheduling.units import duration_s, quantity


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
