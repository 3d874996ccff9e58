"""label-selector-filter / by-label-selector, by-label, decode/prefill/encode-filter, header-based-testing-filter."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from picker.endpoints.model import Endpoint
from picker.plugins import CycleState
from picker.scheduling.plugins import by_label, header_testing, label_selector, roles
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx, ids

PODS = [
    endpoint(1, labels={"app": "vllm", "tier": "gold", "llm-d.ai/role": "decode"}),
    endpoint(2, labels={"app": "vllm", "tier": "silver", "llm-d.ai/role": "prefill"}),
    endpoint(3, labels={"app": "sglang", "llm-d.ai/role": "prefill-decode"}),
    endpoint(4, labels={"app": "vllm", "llm-d.ai/role": "encode"}),
    endpoint(5, labels={"app": "vllm"}),
    endpoint(6, labels={"llm-d.ai/role": "both"}),
    endpoint(7, labels={"llm-d.ai/role": "encode-prefill"}),
    endpoint(8, labels={"llm-d.ai/role": "encode-prefill-decode"}),
]


def _selector(raw: dict[str, object], type_name: str = label_selector.TYPE) -> list[int]:
    spec = label_selector.SPEC if type_name == label_selector.TYPE else label_selector.BY_LABEL_SELECTOR_SPEC
    f = spec.create("sel", label_selector.Params.model_validate(raw), ctx())
    assert f.type == type_name
    return ids(f.filter(request(), PODS, CycleState()))


def test_match_labels_and_expressions() -> None:
    assert _selector({"matchLabels": {"app": "vllm"}}) == [1, 2, 4, 5]
    assert _selector({"matchLabels": {"app": "vllm", "tier": "gold"}}) == [1]
    expressions = [{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]
    assert _selector({"matchExpressions": expressions}) == [1, 2]
    assert _selector({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gold"]}]}) == [
        2, 3, 4, 5, 6, 7, 8,
    ]  # fmt: skip
    assert _selector({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}) == [1, 2]
    assert _selector({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}) == [3, 4, 5, 6, 7, 8]
    both = {"matchLabels": {"app": "vllm"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    assert _selector(both, label_selector.BY_LABEL_SELECTOR) == [1, 2]


def test_empty_selector_keeps_everything_and_no_match_keeps_nothing() -> None:
    assert _selector({}) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert _selector({"matchLabels": {"app": "trtllm"}}) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"key": "a", "operator": "In"},  # In needs values
        {"key": "a", "operator": "Exists", "values": ["x"]},  # Exists takes none
        {"key": "a", "operator": "Gt", "values": ["1"]},  # not a label-selector operator
    ],
)
def test_bad_expressions_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        label_selector.Params.model_validate({"matchExpressions": [bad]})


def test_by_label() -> None:
    f = by_label.create("b", by_label.Params(label="tier", validValues=("gold",)), ctx())
    assert ids(f.filter(request(), PODS, CycleState())) == [1]
    lenient = by_label.create("b", by_label.Params(label="tier", validValues=("gold",), allowsNoLabel=True), ctx())
    assert ids(lenient.filter(request(), PODS, CycleState())) == [1, 3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize(
    ("spec", "kept"),
    [
        (roles.SPEC, [1, 3, 5, 6, 8]),  # decode roles, and no role label at all
        (roles.PREFILL_SPEC, [2, 3, 6, 7, 8]),
        (roles.ENCODE_SPEC, [4, 7, 8]),
    ],
)
def test_role_filters(spec: object, kept: list[int]) -> None:
    f = spec.create("r", roles.Params(), ctx())  # type: ignore[attr-defined]
    assert f.type == spec.type  # type: ignore[attr-defined]
    assert ids(f.filter(request(), PODS, CycleState())) == kept


def _dp(i: int, port: int) -> Endpoint:
    return endpoint(i, port=port)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("192.168.1.2", ["192.168.1.2:8000", "192.168.1.2:8001"]),  # an IP keeps every rank
        ("192.168.1.2:8001", ["192.168.1.2:8001"]),
        (" 192.168.1.3 , 192.168.1.1:8000,192.168.1.3", ["192.168.1.3:8000", "192.168.1.1:8000"]),  # header order
        ("10.0.0.9", []),
        ("", []),
        (" , ", []),
    ],
)
def test_header_based_testing_filter(header: str, expected: list[str]) -> None:
    eps = [_dp(1, 8000), _dp(2, 8000), _dp(2, 8001), _dp(3, 8000)]
    f = header_testing.create("h", header_testing.Params(), ctx())
    kept = f.filter(request(headers={"test-epp-endpoint-selection": header}), eps, CycleState())
    assert [e.key for e in kept] == expected


def test_header_based_testing_filter_without_the_header_keeps_none() -> None:
    f = header_testing.create("h", header_testing.Params(), ctx())
    assert list(f.filter(request(), [_dp(1, 8000)], CycleState())) == []


def test_header_items_parse_ipv6() -> None:
    assert header_testing.parse_item("[fd00::1]:8000") == ("fd00::1", 8000)
    assert header_testing.parse_item("[fd00::1]") == ("fd00::1", None)
    assert header_testing.parse_item("fd00::1") == ("fd00::1", None)
    assert header_testing.parse_item("10.0.0.1:80") == ("10.0.0.1", 80)
    v6 = Endpoint.create("fd00::1", 8000)
    f = header_testing.create("h", header_testing.Params(), ctx())
    assert list(f.filter(request(headers={"test-epp-endpoint-selection": "[fd00::1]:8000"}), [v6], CycleState())) == [
        v6
    ]
