"""disagg-headers-handler / prefill-header-handler: the sidecar headers of a scheduling result."""

from __future__ import annotations

from picker.endpoints.model import Endpoint
from picker.plugins import ProfileResult, SchedulingResult
from picker.request import headers as hdr
from picker.scheduling.plugins import disagg_headers
from picker.scheduling.plugins.disagg_headers import DisaggHeadersHandler, Params
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx

D, P, E1, E2 = endpoint(1), endpoint(2), endpoint(3), endpoint(4)
V6 = Endpoint.create("fd00::7", 8200)


def _result(**profiles: ProfileResult | None) -> SchedulingResult:
    return SchedulingResult((D,), "decode", (), {"decode": ProfileResult((D,)), **profiles})


def test_prefill_and_encode_headers() -> None:
    handler = DisaggHeadersHandler("h", Params())
    got = handler.request_headers(request(), _result(prefill=ProfileResult((P, D)), encode=ProfileResult((E1, E2))))
    assert got == {hdr.PREFILLER: P.key, hdr.ENCODERS: f"{E1.key},{E2.key}"}


def test_no_header_without_a_prefill_result_or_target() -> None:
    handler = DisaggHeadersHandler("h", Params())
    assert handler.request_headers(request(), _result()) == {}
    assert handler.request_headers(request(), _result(prefill=None)) == {}
    assert handler.request_headers(request(), _result(prefill=ProfileResult(()))) == {}


def test_ipv6_prefiller_is_bracketed_and_profile_names_are_parameters() -> None:
    handler = DisaggHeadersHandler("h", Params(prefill_profile="p"))
    got = handler.request_headers(request(), _result(p=ProfileResult((V6,)), prefill=ProfileResult((P,))))
    assert got == {hdr.PREFILLER: "[fd00::7]:8200"}


def test_the_legacy_alias_keeps_its_type() -> None:
    plugin = disagg_headers.LEGACY_SPEC.create("old", Params(), ctx())
    assert isinstance(plugin, DisaggHeadersHandler)
    assert plugin.type == "prefill-header-handler"
