"""The real-time driver reproduces virtual time, and an HTTP client sees the same TTFT."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aiohttp
import orjson

from picker.sim.config import EngineConfig, StepTiming
from picker.sim.driver import EngineDriver
from picker.sim.engine import Engine, RequestState, SimRequest
from picker.sim.harness import running
from picker.sim.tokenizer import default_tokenizer
from picker.sim.virtual import run_virtual

TOK = default_tokenizer()
# One request: TTFT = 5 ms + 200 x 0.2 ms = 45 ms, then 9 decode steps of 5 ms.
CONFIG = EngineConfig(timing=StepTiming(overhead_s=0.005, prefill_s_per_token=0.0002, decode_s_per_seq=0.0))
PROMPT = " the" * 200
TOLERANCE_S = 0.025  # event-loop wake-ups and HTTP on a shared 2-core machine


def virtual_ttft() -> float:
    [state] = run_virtual(Engine(CONFIG), [(0.0, SimRequest("v", TOK.encode(PROMPT), 10, ignore_eos=True))])
    assert isinstance(state, RequestState)
    assert state.ttft_s is not None
    return state.ttft_s


async def test_driver_timeline_matches_virtual_time() -> None:
    driver = EngineDriver(Engine(CONFIG))
    task = asyncio.create_task(driver.run())
    try:
        handle = driver.submit(SimRequest("r", TOK.encode(PROMPT), 10, ignore_eos=True))
        while not handle.state.finished:
            await handle.wait()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    state = handle.state
    assert state.ttft_s is not None
    assert abs(state.ttft_s - virtual_ttft()) < TOLERANCE_S
    assert state.ttft_s >= virtual_ttft() - 1e-9  # the engine clock never runs ahead of virtual time
    assert len(state.output_ids) == 10


async def test_client_ttft_matches_virtual_time() -> None:
    expected = virtual_ttft()
    async with running(CONFIG) as srv, aiohttp.ClientSession() as http:
        body = orjson.dumps({"prompt": PROMPT, "max_tokens": 10, "ignore_eos": True, "stream": True})
        await (await http.get(f"{srv.url}/health")).read()  # connection warm
        start = time.perf_counter()
        async with http.post(f"{srv.url}/v1/completions", data=body) as resp:
            await resp.content.readline()
            ttft = time.perf_counter() - start
            await resp.read()
    assert expected - 0.002 <= ttft <= expected + TOLERANCE_S


async def test_reset_wakes_waiting_handles() -> None:
    driver = EngineDriver(Engine(CONFIG))
    task = asyncio.create_task(driver.run())
    try:
        handle = driver.submit(SimRequest("r", TOK.encode(PROMPT), 100, ignore_eos=True))
        await handle.wait()
        driver.reset()
        await asyncio.wait_for(handle.wait(), 1.0)
        assert handle.state.finish_reason == "abort"
        # The driver keeps serving after a reset.
        again = driver.submit(SimRequest("r2", TOK.encode(" the"), 2, ignore_eos=True))
        while not again.state.finished:
            await asyncio.wait_for(again.wait(), 1.0)
        assert again.state.finish_reason == "length"
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_no_request_is_served_before_it_arrived() -> None:
    fast = EngineConfig(timing=StepTiming(overhead_s=0.001, prefill_s_per_token=0.0, decode_s_per_seq=0.0))
    driver = EngineDriver(Engine(fast))
    task = asyncio.create_task(driver.run())
    try:
        handles = []
        for i in range(40):
            handles.append(driver.submit(SimRequest(f"r{i}", TOK.encode(" the cat"), 5, ignore_eos=True)))
            await asyncio.sleep(0.0007 * (i % 3))
        for h in handles:
            while not h.state.finished:
                await asyncio.wait_for(h.wait(), 2.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for h in handles:
        s = h.state
        assert s.scheduled_s is not None
        assert s.first_token_s is not None
        assert s.arrival_s <= s.scheduled_s < s.first_token_s
