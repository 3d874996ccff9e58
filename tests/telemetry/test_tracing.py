"""Tracing end to end: a real picker exports its spans over OTLP/gRPC to an in-process collector stand-in.

Checks the span tree (request → orchestration → admission, scheduling), the W3C parent taken from the request's
``traceparent``, the context forwarded to the model server, the scheduling attributes, errors, and the
environment-driven setup (service name, sampler, exporter choice).
"""

from __future__ import annotations

import argparse

import orjson
import pytest
from opentelemetry.sdk.trace.sampling import ParentBased

from picker import app
from picker.telemetry import tracing
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, settings
from tests.extproc.gateway import EnvoyFullDuplex, NginxShim, gateway
from tests.telemetry.otlp_receiver import receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
HEADERS = {
    ":method": "POST",
    ":path": "/v1/completions",
    "content-type": "application/json",
    "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01",
}
BODY = orjson.dumps({"model": "m", "prompt": "hello there", "max_tokens": 10})
SPAN_KIND_SERVER = 2


@pytest.fixture
def otlp_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export batches every 50 ms
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)


@pytest.mark.usefixtures("otlp_env")
async def test_spans_reach_the_collector_with_parents_and_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store([endpoint(1, waiting=5), endpoint(2, waiting=0), endpoint(3, waiting=9)])
    async with receiver() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        serving = app.serving(settings(tracing=True), store=store, scrape=False)
        async with serving as running, gateway(EnvoyFullDuplex, running.grpc_target) as gw:
            out = await gw.request(HEADERS, [BODY])
        # serving's exit flushed the batch processor: everything is at the collector now.
        (request,) = await collector.wait_for(tracing.REQUEST_SPAN)
        (orchestration,) = await collector.wait_for(tracing.ORCHESTRATION_SPAN)
        (scheduling,) = await collector.wait_for(tracing.SCHEDULING_SPAN)
        admission = collector.named(tracing.ADMISSION_SPAN)

    assert out.routed
    # The client's trace continues through picker: same trace id, parent = the client's span.
    assert {s.trace_id for s in collector.spans} == {TRACE_ID}
    assert request.parent_span_id == CLIENT_SPAN
    assert request.kind == SPAN_KIND_SERVER
    assert orchestration.parent_span_id == request.span_id
    assert scheduling.parent_span_id == orchestration.span_id
    for span in admission:
        assert span.parent_span_id == orchestration.span_id
        assert span.attributes["picker.admission.wait_ms"] >= 0.0
    assert request.start_ns <= orchestration.start_ns <= scheduling.start_ns <= scheduling.end_ns <= request.end_ns

    # The scheduling cycle: candidates, choice, per-plugin scores.
    chosen = out.destination
    assert scheduling.attributes["picker.endpoint"] == chosen
    assert scheduling.attributes["picker.candidates.count"] == 3
    assert sorted(scheduling.attributes["picker.candidates"]) == sorted(e.key for e in store.current().endpoints)
    profiles = orjson.loads(scheduling.attributes["picker.scores"])
    assert profiles[0]["picked"] == [chosen]
    assert "queue-scorer" in profiles[0]["scores"]
    assert set(profiles[0]["scores"]["queue-scorer"]) == set(scheduling.attributes["picker.candidates"])

    assert request.attributes["gen_ai.request.model"] == "m"
    assert request.attributes["picker.destination"] == chosen
    assert request.resource["service.name"] == tracing.DEFAULT_SERVICE_NAME

    # The model server gets picker's request span as its parent (W3C traceparent in the routed headers).
    assert out.set_headers["traceparent"] == f"00-{TRACE_ID}-{request.span_id}-01"


@pytest.mark.usefixtures("otlp_env")
async def test_a_request_without_trace_context_starts_a_trace_and_errors_are_marked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = make_store([endpoint(1)])
    monkeypatch.setenv("OTEL_SERVICE_NAME", "picker-under-test")
    async with receiver() as collector:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        serving = app.serving(settings(tracing=True), store=store, scrape=False)
        async with serving as running, gateway(NginxShim, running.grpc_target) as gw:
            ok = await gw.request({"content-type": "application/json"}, [BODY])
            bad = await gw.request({"content-type": "application/json"}, [b"{not json"])
        spans = await collector.wait_for(tracing.REQUEST_SPAN, count=2)

    assert ok.routed
    assert bad.status == 400
    good_span, bad_span = sorted(spans, key=lambda s: s.status_code)
    assert good_span.parent_span_id == ""  # a new trace
    assert good_span.resource["service.name"] == "picker-under-test"
    assert bad_span.status_code == 2  # ERROR
    assert bad_span.attributes["http.response.status_code"] == 400
    assert bad_span.attributes["error.type"] == "BadRequest"
    assert good_span.trace_id != bad_span.trace_id


async def test_without_tracing_nothing_is_added() -> None:
    async with app.serving(settings(), store=make_store([endpoint(1)]), scrape=False) as running:
        assert running.director.tracer is None
        async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:
            out = await gw.request(HEADERS, [BODY])
    assert out.routed
    assert "traceparent" not in out.set_headers  # the client's own header reaches the server untouched


def test_tracing_flag_and_reference_default() -> None:
    parser = argparse.ArgumentParser()
    app.configure(parser)
    assert app.settings_from_args(parser.parse_args([])).server.tracing is False
    assert app.settings_from_args(parser.parse_args(["--tracing"])).server.tracing is True
    assert app.settings_from_args(parser.parse_args(["--tracing=true"])).server.tracing is True
    assert app.settings_from_args(parser.parse_args(["--tracing=false"])).server.tracing is False


def test_sampler_and_exporter_come_from_the_environment() -> None:
    env = {"OTEL_TRACES_EXPORTER": "none", "OTEL_SERVICE_NAME": "svc"}
    provider = tracing.start(env)
    try:
        assert provider.resource.attributes["service.name"] == "svc"
        assert isinstance(provider.sampler, ParentBased)  # the SDK default, parentbased_always_on
    finally:
        tracing.stop(provider)
    with pytest.raises(ValueError, match="otlp, console or none"):
        tracing.start({"OTEL_TRACES_EXPORTER": "zipkin"})
    with pytest.raises(ValueError, match="grpc only"):
        tracing.start({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
