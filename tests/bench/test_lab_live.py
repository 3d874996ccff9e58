"""The lab against the live stack: the same workload live (HTTP servers, load client) and in virtual time, and
picker's scraper reading a live simulator's /metrics page."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from picker.bench import procs
from picker.bench import workloads as wl
from picker.bench.lab import LabConfig, poisson_schedule, run_lab
from picker.bench.load import LoadSpec, merge_results, run_load
from picker.bench.report import summarize
from picker.scrape import engines
from picker.sim.config import preset
from picker.sim.harness import running

ENGINE = preset("h100-8b", num_gpu_blocks=2048)
RATE_PER_SERVER, REQUESTS_PER_SERVER, SEED = 5.0, 20, 7


def small_workload() -> wl.Workload:
    # Prompts of ~900 tokens, 512 of them shared by a group: the median TTFT (~160 ms) lies among many close
    # values, and the live path's fixed 5-10 ms (HTTP, tokenising, timers) stays inside 10 %.
    return wl.shared_prefix(
        num_groups=2, prompts_per_group=16, system_prompt_len=512, question_len=384, output_len=16, seed=SEED
    )


@contextlib.asynccontextmanager
async def servers(n: int) -> AsyncIterator[list[str]]:
    """``picker sim`` in its own process, as in production: the load client's work does not delay its steps."""
    ports = [procs.free_port() for _ in range(n)]
    argv = [*procs.picker_command(), "sim", "--preset", "h100-8b", "--num-gpu-blocks", str(ENGINE.num_gpu_blocks)]
    async with procs.spawn("sims", [*argv, "--ports", ",".join(map(str, ports))]) as child:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for url in urls:
            await child.wait_http(f"{url}/health")
        yield urls
        async with aiohttp.ClientSession() as http:
            for url in urls:
                async with http.get(f"{url}/metrics") as resp:
                    page = (await resp.read()).decode()
                lag = next(ln for ln in page.splitlines() if ln.startswith("sim:driver_max_lag_seconds"))
                print(f"{url} {lag}")


async def test_live_and_virtual_p50_ttft_agree_within_10_percent() -> None:
    """Live: the load client drives each of two servers with the same seeded stream (``--url a,b``). Lab: the
    same stream twice, at the same times, round robin over two engines, so each engine gets exactly one copy."""
    workload = small_workload()
    spec = LoadSpec(rate=RATE_PER_SERVER, max_requests=REQUESTS_PER_SERVER, seed=SEED, drain_s=20.0)
    async with servers(2) as sims:
        live = merge_results(await asyncio.gather(*(run_load(url, workload, spec) for url in sims)))
    schedule = poisson_schedule(workload, RATE_PER_SERVER, REQUESTS_PER_SERVER, SEED)
    doubled = [a for a in schedule for _ in range(2)]
    lab = run_lab(LabConfig(ENGINE, engines=2), "rr", doubled, workload=workload)

    live_s, lab_s = summarize(live), summarize(lab.result)
    assert (live_s.ok, lab_s.ok) == (2 * REQUESTS_PER_SERVER, 2 * REQUESTS_PER_SERVER)
    # The same work reached the engines: the same prompts, the same cache hits, the same answers' lengths.
    assert (live_s.prompt_tokens, live_s.cached_tokens, live_s.output_tokens) == (
        lab_s.prompt_tokens,
        lab_s.cached_tokens,
        lab_s.output_tokens,
    )
    ratio = live_s.ttft_s.p50 / lab_s.ttft_s.p50
    print(
        f"\nTTFT p50 live {live_s.ttft_s.p50 * 1e3:.1f} ms, lab {lab_s.ttft_s.p50 * 1e3:.1f} ms (ratio {ratio:.3f}); "
        f"p90 live {live_s.ttft_s.p90 * 1e3:.1f} ms, lab {lab_s.ttft_s.p90 * 1e3:.1f} ms; "
        f"TPOT p50 live {live_s.tpot_s.p50 * 1e3:.2f} ms, lab {lab_s.tpot_s.p50 * 1e3:.2f} ms"
    )
    assert ratio == pytest.approx(1.0, abs=0.10)


async def test_scraper_reads_the_simulators_metrics_page() -> None:
    """``scrape.engines.extract("vllm", page)`` on a live simulator mid-run agrees with its /admin/stats."""
    engine = preset("h100-8b", max_num_seqs=2, lora_adapters=("ad1",), max_loras=1)
    async with running(engine) as sim, aiohttp.ClientSession() as http:

        async def generate(model: str, max_tokens: int) -> None:
            body = {"model": model, "prompt": " the" * 200, "max_tokens": max_tokens, "ignore_eos": True}
            async with http.post(f"{sim.url}/v1/completions", data=orjson.dumps(body)) as resp:
                assert resp.status == 200
                await resp.read()

        # Two long adapter requests fill both sequence slots; a base and an adapter request wait behind them.
        tasks = [asyncio.create_task(generate(m, n)) for m, n in (("ad1", 300), ("ad1", 300), ("sim-model", 4))]
        tasks.append(asyncio.create_task(generate("ad1", 4)))
        for _ in range(200):  # until every request reached the engine (bounded: 2 s)
            if sim.engine.stats().waiting == 2:
                break
            await asyncio.sleep(0.01)
        async with http.get(f"{sim.url}/metrics") as resp:
            page = await resp.read()
        async with http.get(f"{sim.url}/admin/stats") as resp:
            stats = orjson.loads(await resp.read())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    metrics = engines.extract("vllm", page, now=123.0)
    assert (metrics.running, metrics.waiting) == (stats["running"], stats["waiting"]) == (2, 2)
    assert metrics.kv_usage == pytest.approx(stats["kv_usage"], abs=0.002)  # a block may fill between the GETs
    assert metrics.kv_usage > 0
    assert metrics.running_loras == frozenset({"ad1"})
    assert metrics.waiting_loras == frozenset({"ad1"})
    assert metrics.max_loras == 1
    assert (metrics.block_size, metrics.num_gpu_blocks) == (16, engine.num_gpu_blocks)
    assert metrics.updated_at == 123.0
