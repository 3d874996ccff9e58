"""The load client against an in-process simulator: counts, tokens, Little's law, caps, errors."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

import aiohttp
import pytest

from picker.bench import workloads as wl
from picker.bench.load import (
    LoadSpec,
    RequestRecord,
    detokenize,
    fetch_models,
    poisson_arrivals,
    run_load,
    tokenize,
)
from picker.bench.report import summarize
from picker.sim.config import preset
from picker.sim.faults import Faults
from picker.sim.harness import running
from picker.sim.server import SimServer

FAST = preset("fast", lora_adapters=("a", "b"), max_loras=2)


@pytest.fixture
async def sim() -> AsyncIterator[SimServer]:
    async with running(FAST) as srv:
        yield srv


async def test_closed_loop_counts_tokens_and_littles_law(sim: SimServer) -> None:
    seen: list[RequestRecord] = []
    work = wl.with_fixed(wl.fixed_lengths(prompt_len=64), 8)
    spec = LoadSpec(concurrency=4, max_requests=40)
    result = await run_load(sim.url, work, spec, on_record=seen.append)
    assert len(result.records) == len(seen) == 40
    assert [r.index for r in result.records] == list(range(40))
    for r in result.records:
        assert r.ok, r.error
        assert (r.output_tokens, r.chunks, r.prompt_tokens) == (8, 8, 64)
        assert r.ttft_s is not None
        assert 0 < r.ttft_s < r.e2e_s
        assert r.backend == sim.name
        assert r.finish_reason == "length"
    s = summarize(result)
    assert (s.ok, s.failed, s.output_tokens) == (40, 0, 320)
    assert s.littles_ratio == pytest.approx(1.0, abs=0.2)
    assert s.mean_inflight == pytest.approx(4.0, abs=0.8)
    assert sim.metrics.success == {"length": 40}  # the server saw exactly these requests


async def test_open_loop_poisson(sim: SimServer) -> None:
    # ~0.3 s of arrivals of ~40 ms requests: sample in-flight often enough for a short window.
    spec = LoadSpec(rate=100.0, max_requests=30, seed=3, sample_interval_s=0.002)
    result = await run_load(sim.url, wl.fixed_lengths(prompt_len=32, output_len=20), spec)
    assert len(result.records) == 30
    starts = [r.start_s for r in result.records]
    assert starts == sorted(starts)
    assert 0.05 < starts[-1] < 2.0  # ~0.3 s of Poisson arrivals
    s = summarize(result)
    assert s.ok == 30
    assert s.littles_ratio is not None
    assert s.littles_ratio == pytest.approx(1.0, abs=0.25)
    planned = [0.0, *itertools.islice(poisson_arrivals(100.0, 3), 29)]
    assert all(r.start_s >= at for r, at in zip(result.records, planned, strict=True))  # never early


def test_poisson_arrivals_are_seeded_with_the_right_rate() -> None:
    a = list(itertools.islice(poisson_arrivals(50.0, 1), 2000))
    assert a == list(itertools.islice(poisson_arrivals(50.0, 1), 2000))
    assert a != list(itertools.islice(poisson_arrivals(50.0, 2), 2000))
    assert a == sorted(a)
    assert 2000 / a[-1] == pytest.approx(50.0, rel=0.1)


async def test_duration_cap_stops_issuing(sim: SimServer) -> None:
    spec = LoadSpec(rate=50.0, max_requests=10_000, max_duration_s=0.3)
    result = await run_load(sim.url, wl.fixed_lengths(prompt_len=8, output_len=2), spec)
    assert 1 <= len(result.records) < 60
    assert all(r.start_s < 0.3 + 0.2 for r in result.records)  # none issued after the cap (+ loop delay)


async def test_shared_prefix_hits_the_cache_and_chat_works(sim: SimServer) -> None:
    work = wl.shared_prefix(num_groups=2, prompts_per_group=4, system_prompt_len=256, question_len=16, output_len=4)
    result = await run_load(sim.url, work, LoadSpec(concurrency=1, max_requests=8, api="chat"))
    assert all(r.ok for r in result.records)
    assert sum(r.cached_tokens or 0 for r in result.records) >= 6 * 256 - 6 * 16


async def test_non_stream_and_lora_models(sim: SimServer) -> None:
    work = wl.multi_lora(wl.fixed_lengths(prompt_len=8, output_len=3), ["a", "b"], seed=2)
    result = await run_load(sim.url, work, LoadSpec(concurrency=2, max_requests=10, stream=False))
    assert all(r.ok for r in result.records)
    assert {r.model for r in result.records} == {"a", "b"}
    assert all(r.chunks == 1 and r.output_tokens >= 1 for r in result.records)


async def test_errors_are_recorded_not_raised() -> None:
    async with running(FAST, faults=Faults(error_rate=1.0, error_types=("server_error",))) as srv:
        result = await run_load(srv.url, wl.fixed_lengths(), LoadSpec(concurrency=2, max_requests=6))
    assert [r.status for r in result.records] == [500] * 6
    assert all(r.error and "injected" in r.error for r in result.records)
    assert summarize(result).errors == {"HTTP 500": 6}


async def test_hung_requests_time_out_and_the_run_stays_bounded() -> None:
    async with running(FAST, faults=Faults(hang_rate=1.0, hang_s=30)) as srv:
        spec = LoadSpec(concurrency=2, max_requests=2, timeout_s=0.2, max_duration_s=5)
        result = await run_load(srv.url, wl.fixed_lengths(), spec)
    assert [r.error for r in result.records] == ["timeout", "timeout"]


async def test_drain_cancels_stragglers() -> None:
    async with running(FAST, faults=Faults(hang_rate=1.0, hang_s=30)) as srv:
        spec = LoadSpec(rate=20, max_requests=3, max_duration_s=0.2, drain_s=0.1, timeout_s=60)
        result = await run_load(srv.url, wl.fixed_lengths(), spec)
    assert result.records
    assert all(r.error == "cancelled" for r in result.records)


async def test_connection_refused_is_an_error_record() -> None:
    async with running(FAST) as srv:
        url = srv.url
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientError):
            await fetch_models(url, http)
    result = await run_load(url, wl.fixed_lengths(), LoadSpec(concurrency=1, max_requests=2, model="m"))
    assert all(r.status == 0 and r.error and r.error.startswith("Client") for r in result.records)


async def test_tokenize_helpers(sim: SimServer) -> None:
    async with aiohttp.ClientSession() as http:
        assert await fetch_models(sim.url, http) == ["sim-model", "a", "b"]
        ids = await tokenize(sim.url, "The cat sat.", http)
        ids2, pieces = await tokenize(sim.url, "The cat sat.", http, None, with_pieces=True)
        assert ids == ids2
        assert pieces is not None
        assert "".join(pieces) == "The cat sat."
        assert await detokenize(sim.url, ids, http) == "The cat sat."


def test_spec_validation() -> None:
    for bad, match in (
        ({}, "exactly one"),
        ({"rate": 1.0, "concurrency": 1}, "exactly one"),
        ({"rate": 0.0}, "rate"),
        ({"concurrency": 0}, "concurrency"),
        ({"rate": 1.0, "max_requests": 0}, "max_requests"),
        ({"rate": 1.0, "max_duration_s": 0}, "max_duration_s"),
    ):
        with pytest.raises(ValueError, match=match):
            LoadSpec(**bad)
