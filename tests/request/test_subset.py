"""parse_subset / filter_candidates: list or comma string; ip = any port, ip:port = exact; [] admits nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from picker.endpoints.model import Endpoint
from picker.request.model import Subset
from picker.request.subset import filter_candidates, parse_subset
from tests.conftest import endpoint


def _keys(eps: tuple[Endpoint, ...]) -> list[str]:
    return [e.key for e in eps]


POOL = (endpoint(1), endpoint(2), endpoint(3), endpoint(1, port=8001), endpoint(2, port=8001))


def test_absent_hint_admits_everything() -> None:
    assert parse_subset(None) is None
    assert filter_candidates(POOL, None) == POOL


def test_value_that_is_not_a_list_is_no_hint() -> None:
    assert parse_subset(42) is None
    assert parse_subset({"a": 1}) is None


def test_empty_list_admits_nothing() -> None:
    subset = parse_subset([])
    assert subset == Subset()
    assert subset is not None
    assert subset.empty
    assert filter_candidates(POOL, subset) == ()


def test_ip_admits_every_port_of_that_ip() -> None:
    assert _keys(filter_candidates(POOL, parse_subset(["192.168.1.1"]))) == ["192.168.1.1:8000", "192.168.1.1:8001"]


def test_ip_port_is_exact() -> None:
    assert _keys(filter_candidates(POOL, parse_subset(["192.168.1.2:8001"]))) == ["192.168.1.2:8001"]


def test_comma_string_and_whitespace() -> None:
    subset = parse_subset(" 192.168.1.3:8000 , 192.168.1.1:8001,")
    assert _keys(filter_candidates(POOL, subset)) == ["192.168.1.3:8000", "192.168.1.1:8001"]


def test_list_entries_may_be_comma_strings_and_non_strings_are_ignored() -> None:
    subset = parse_subset(["192.168.1.1:8000,192.168.1.2:8000", 7, None, {"x": 1}])
    assert _keys(filter_candidates(POOL, subset)) == ["192.168.1.1:8000", "192.168.1.2:8000"]


def test_only_non_strings_admit_nothing() -> None:
    assert filter_candidates(POOL, parse_subset([1, 2])) == ()


def test_reference_case_9_unknown_ip_admits_nothing() -> None:
    assert filter_candidates(POOL, parse_subset(["192.168.1.99:8000"])) == ()


@pytest.mark.parametrize("hint", ["[fd00::1]:8000", "[fd00:0:0:0:0:0:0:1]:8000", "fd00::1", "[fd00::1]"])
def test_ipv6(hint: str) -> None:
    ep = Endpoint.create("fd00::1", 8000)
    other = Endpoint.create("fd00::2", 8000)
    assert filter_candidates((ep, other), parse_subset([hint])) == (ep,)


def test_malformed_entries_admit_nothing() -> None:
    subset = parse_subset(["192.168.1.1:notaport", "[fd00::1", "192.168.1.2:0", "192.168.1.3:70000"])
    assert filter_candidates(POOL, subset) == ()


@settings(max_examples=200, deadline=None)
@given(value=st.none() | st.text() | st.lists(st.text() | st.integers() | st.none(), max_size=6) | st.integers())
def test_any_hint_value_parses(value: object) -> None:
    subset = parse_subset(value)
    assert subset is None or isinstance(subset, Subset)
    filter_candidates(POOL, subset)
