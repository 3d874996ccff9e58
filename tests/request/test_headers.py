"""Header constants: spelled as the reference; the system-owned set never echoes picker's own or control headers."""

from __future__ import annotations

from picker.request import headers as hdr


def test_reference_spellings() -> None:
    assert hdr.DESTINATION == "x-gateway-destination-endpoint"
    assert hdr.DESTINATION_SERVED == "x-gateway-destination-endpoint-served"
    assert hdr.SUBSET_KEY == "x-gateway-destination-endpoint-subset"
    assert hdr.SUBSET_NAMESPACE == "envoy.lb.subset_hint"
    assert hdr.LB_NAMESPACE == "envoy.lb"
    assert hdr.OBJECTIVE == "x-gateway-inference-objective"
    assert hdr.FAIRNESS_ID == "x-gateway-inference-fairness-id"
    assert hdr.MODEL_REWRITE == "x-gateway-model-name-rewrite"
    assert hdr.REQUEST_ID == "x-request-id"


def test_system_owned_is_the_reference_list_plus_llm_d() -> None:
    reference = {
        "x-gateway-inference-fairness-id",
        "x-gateway-inference-objective",
        "x-gateway-model-name-rewrite",
        "x-gateway-destination-endpoint-subset",
        "x-gateway-destination-endpoint",
        "x-gateway-destination-endpoint-served",
        "content-length",
    }
    llm_d = {"x-prefiller-host-port", "x-encoder-hosts-ports", "x-data-parallel-host-port", "x-session-token"}
    assert reference | llm_d == hdr.SYSTEM_OWNED
    assert hdr.REQUEST_ID not in hdr.SYSTEM_OWNED  # forwarded (generated if absent)


def test_control_headers_are_system_owned_and_lower_case() -> None:
    assert hdr.CONTROL <= hdr.SYSTEM_OWNED
    assert all(h == h.lower() for h in hdr.SYSTEM_OWNED)
