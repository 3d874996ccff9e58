"""``picker bench scrape-parse``: how fast picker reads a vLLM ``/metrics`` page, and what polling costs.

Parse mode (default) builds realistic vLLM pages (46 KB for one model name, 102 KB for three: the process and
python collectors, HTTP-instrumentator metrics, every vLLM histogram with its ``_created`` series, LoRA info,
cache config info) and times, on the same bytes, picker's ``engines.extract("vllm", ...)`` against
prometheus_client's ``text_string_to_metric_families`` (plus picking the same fields). Each parser runs
``--repeat`` rounds of ``--number`` pages (auto-ranged to ≥0.2 s per round, as ``timeit`` does); the table
shows medians: µs per page, pages per second and the ratio to picker.

``--poll N`` also runs the real poller against N local HTTP servers (a child process) serving the last page for
``--seconds`` at ``--interval`` and reports picker's CPU time per poll (``getrusage``, whole process, user and
kernel; on loopback the kernel time includes TCP work a real NIC would not charge to picker).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import random
import resource
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Callable, Sequence

from prometheus_client.parser import text_string_to_metric_families

from picker.bench import flags
from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.endpoints.store import EndpointStore
from picker.scheduling import units
from picker.scrape import engines
from picker.settings import ScrapeSettings
from picker.telemetry import REGISTRY

__all__ = ["configure", "reference_extract", "run", "vllm_page"]

_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)
_HISTOGRAMS: tuple[tuple[str, str, tuple[float, ...]], ...] = (
    ("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", _TOKEN_BUCKETS),
    ("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS),
    ("vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds.", _TPOT_BUCKETS),
    ("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _TPOT_BUCKETS),
    ("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", _LATENCY_BUCKETS),
    ("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", _LATENCY_BUCKETS),
    ("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", _LATENCY_BUCKETS),
    ("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", _LATENCY_BUCKETS),
    ("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", _LATENCY_BUCKETS),
    ("vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", "Number of generation tokens processed.", _TOKEN_BUCKETS),
    (
        "vllm:request_max_num_generation_tokens",
        "Histogram of maximum number of requested generation tokens.",
        _TOKEN_BUCKETS,
    ),
    ("vllm:request_params_n", "Histogram of the n request parameter.", (1.0, 2.0, 5.0, 10.0, 20.0)),
    ("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", _TOKEN_BUCKETS),
)
_HTTP_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    3.0,
    3.5,
    4.0,
    4.5,
    5.0,
    7.5,
    10.0,
    30.0,
    60.0,
)
_HANDLERS = ("/v1/chat/completions", "/v1/completions", "/metrics", "/health", "/v1/models")


def vllm_page(
    models: Sequence[str] = ("meta-llama/Llama-3.1-8B-Instruct", "llama-8b", "sql-lora"),
    *,
    seed: int = 7,
    waiting: int = 3,
    running: int = 12,
    kv_usage: float = 0.4375,
) -> bytes:
    """A vLLM ``/metrics`` page as prometheus_client renders it; the first model's core gauges have the given values."""
    rnd = random.Random(seed)
    out: list[str] = []
    add = out.append
    for gen in range(3):
        add(f'python_gc_objects_collected_total{{generation="{gen}"}} {rnd.randint(10, 90000)}.0')
    add('python_info{implementation="CPython",major="3",minor="12",patchlevel="9",version="3.12.9"} 1.0')
    for name, value in (
        ("process_virtual_memory_bytes", 6.1e10),
        ("process_resident_memory_bytes", 3.4e9),
        ("process_start_time_seconds", 1.7551e9),
        ("process_cpu_seconds_total", 4242.17),
        ("process_open_fds", 97.0),
        ("process_max_fds", 1048576.0),
    ):
        add(f"# HELP {name} Process metric.\n# TYPE {name} gauge\n{name} {value}")
    add("# HELP http_requests_total Total number of requests by method, status and handler.")
    add("# TYPE http_requests_total counter")
    for handler in _HANDLERS:
        add(f'http_requests_total{{handler="{handler}",method="POST",status="2xx"}} {rnd.randint(1, 10**6)}.0')
    add("# HELP http_request_duration_highr_seconds Latency with many buckets but no API specific labels.")
    add("# TYPE http_request_duration_highr_seconds histogram")
    _histogram_series(add, rnd, "http_request_duration_highr_seconds", "", _HTTP_BUCKETS)
    add("# HELP http_request_duration_seconds Latency with only few buckets by handler.")
    add("# TYPE http_request_duration_seconds histogram")
    for handler in _HANDLERS:
        _histogram_series(
            add, rnd, "http_request_duration_seconds", f'handler="{handler}",method="POST",', (0.1, 0.5, 1.0)
        )
    for i, (name, help_text) in enumerate(
        (
            ("vllm:num_requests_running", "Number of requests in model execution batches."),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
        )
    ):
        add(f"# HELP {name} {help_text}\n# TYPE {name} gauge")
        for j, model in enumerate(models):
            value = (float(running), float(waiting), kv_usage)[i] if j == 0 else float(rnd.randint(0, 9))
            add(f'{name}{{engine="0",model_name="{model}"}} {value}')
    for name in (
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    ):
        add(f"# HELP {name}_total Counter.\n# TYPE {name}_total counter")
        for model in models:
            add(f'{name}_total{{engine="0",model_name="{model}"}} {rnd.randint(0, 10**7)}.0')
        add(f"# HELP {name}_created Counter.\n# TYPE {name}_created gauge")
        for model in models:
            add(f'{name}_created{{engine="0",model_name="{model}"}} 1.7551{rnd.randint(100000, 999999)}e+09')
    add("# HELP vllm:request_success_total Count of successfully processed requests.")
    add("# TYPE vllm:request_success_total counter")
    for model in models:
        for reason in ("stop", "length", "abort"):
            labels = f'engine="0",finished_reason="{reason}",model_name="{model}"'
            add(f"vllm:request_success_total{{{labels}}} {rnd.randint(0, 10**5)}.0")
    for name, help_text, buckets in _HISTOGRAMS:
        add(f"# HELP {name} {help_text}\n# TYPE {name} histogram")
        for model in models:
            _histogram_series(add, rnd, name, f'engine="0",model_name="{model}",', buckets)
        add(f"# HELP {name}_created {help_text}\n# TYPE {name}_created gauge")
        for model in models:
            add(f'{name}_created{{engine="0",model_name="{model}"}} 1.7551{rnd.randint(100000, 999999)}e+09')
    add("# HELP vllm:lora_requests_info Running stats on lora requests.\n# TYPE vllm:lora_requests_info gauge")
    add('vllm:lora_requests_info{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""} 1.755100001e+09')
    add(
        'vllm:lora_requests_info{max_lora="4",running_lora_adapters="sql-lora, chat-lora",'
        'waiting_lora_adapters="tool-lora"} 1.755100123e+09'
    )
    add("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge")
    add(
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",'
        'enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27153",'
        'prefix_caching_hash_algo="sha256",swap_space="4",swap_space_bytes="4294967296"} 1.0'
    )
    return ("\n".join(out) + "\n").encode()


def _histogram_series(
    add: Callable[[str], None], rnd: random.Random, name: str, labels: str, buckets: Sequence[float]
) -> None:
    count = 0
    for le in buckets:
        count += rnd.randint(0, 500)
        add(f'{name}_bucket{{{labels}le="{le}"}} {count}.0')
    add(f'{name}_bucket{{{labels}le="+Inf"}} {count}.0')
    add(f"{name}_count{{{labels.rstrip(',')}}} {count}.0")
    add(f"{name}_sum{{{labels.rstrip(',')}}} {rnd.uniform(0, 1e5)}")


def reference_extract(page: bytes) -> EndpointMetrics:
    """The same fields as ``engines.extract("vllm", ...)`` read with prometheus_client's full parser."""
    first: dict[str, float] = {}
    lora_labels: dict[str, str] = {}
    lora_time = float("-inf")
    cache_labels: dict[str, str] = {}
    for family in text_string_to_metric_families(page.decode()):
        for s in family.samples:
            if s.name == "vllm:lora_requests_info" and s.value > lora_time:
                lora_time, lora_labels = s.value, s.labels
            elif s.name == "vllm:cache_config_info" and not cache_labels:
                cache_labels = s.labels
            elif s.name not in first:
                first[s.name] = s.value
    running = frozenset(a.strip() for a in lora_labels.get("running_lora_adapters", "").split(",") if a.strip())
    waiting = frozenset(a.strip() for a in lora_labels.get("waiting_lora_adapters", "").split(",") if a.strip())
    return EndpointMetrics(
        waiting=round(first["vllm:num_requests_waiting"]),
        running=round(first["vllm:num_requests_running"]),
        kv_usage=first["vllm:kv_cache_usage_perc"],
        running_loras=running,
        waiting_loras=waiting,
        max_loras=int(lora_labels.get("max_lora", "0")),
        block_size=int(cache_labels["block_size"]),
        num_gpu_blocks=int(cache_labels["num_gpu_blocks"]),
        generated_tokens=first.get("vllm:generation_tokens_total"),
        prefix_query_tokens=first.get("vllm:prefix_cache_queries_total"),
        prefix_hit_tokens=first.get("vllm:prefix_cache_hits_total"),
    )


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--models", default="1,3", help="pages to time, as model-name counts (default 1,3: 46 KB and 102 KB)"
    )
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds per parser; medians are shown")
    parser.add_argument(
        "--number", type=units.at_least(0), default=0, help="pages per round (0: auto-range to >=0.2 s)"
    )
    parser.add_argument(
        "--poll", type=units.at_least(0), default=0, metavar="N", help="also poll N local servers: CPU per poll"
    )
    parser.add_argument("--seconds", type=units.above(0), default=5.0, help="--poll run time")
    parser.add_argument("--interval", type=units.above(0), default=0.1, help="--poll interval in seconds")


def run(args: argparse.Namespace) -> int:
    try:
        counts = flags.numbers(str(args.models), "--models", int, least=1)
    except ValueError as exc:
        print(f"picker bench scrape-parse: {exc}", file=sys.stderr)
        return 2
    print(f"{'page':<24}{'parser':<52}{'µs/page':>11}{'pages/s':>10}{'ratio':>8}")
    models: list[str] = []
    for count in counts:
        models = ["meta-llama/Llama-3.1-8B-Instruct", *(f"served-name-{i}" for i in range(1, max(1, count)))]
        page = vllm_page(models)
        ours, theirs = engines.extract("vllm", page, 0.0), reference_extract(page)
        if ours != theirs:
            print(f"parsers disagree:\n  picker:            {ours}\n  prometheus_client: {theirs}")
            return 1
        label = f"{len(page) / 1024:.0f} KB, {len(models)} model name{'s' if len(models) > 1 else ''}"
        rows = [
            ("picker engines.extract (vllm)", _median_s(functools.partial(engines.extract, "vllm", page, 0.0), args)),
            (
                "prometheus_client text_string_to_metric_families",
                _median_s(functools.partial(reference_extract, page), args),
            ),
        ]
        base = rows[0][1]
        for name, seconds in rows:
            print(f"{label:<24}{name:<52}{seconds * 1e6:>11,.1f}{1 / seconds:>10,.0f}{seconds / base:>7.1f}x")
    if args.poll > 0:
        _report_polling(models, args.poll, args.seconds, args.interval)
    return 0


def _median_s(fn: Callable[[], object], args: argparse.Namespace) -> float:
    timer = timeit.Timer(fn)
    number = args.number if args.number > 0 else timer.autorange()[0]
    return statistics.median(t / number for t in timer.repeat(max(1, args.repeat), number))


def _report_polling(models: Sequence[str], count: int, seconds: float, interval_s: float) -> None:
    # The servers run in a child process so that the CPU measured here is the poller's alone.
    code = "import sys, json; from picker.bench import scrape_parse as m; m._serve(int(sys.argv[1]), sys.argv[2:])"
    child = subprocess.Popen([sys.executable, "-c", code, str(count), *models], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # "" if the child died
        if not line:
            raise RuntimeError("the page server did not start")
        ports: list[int] = json.loads(line)
        polls, user_s, system_s = asyncio.run(_poll_for(ports, seconds, interval_s))
    finally:
        child.terminate()
        child.wait(10)
    cpu_s = user_s + system_s
    per_poll_us = cpu_s / max(1, polls) * 1e6
    print(f"\npoller: {count} endpoints, interval {interval_s * 1e3:.0f} ms, {seconds:.1f} s: {polls:,} polls")
    print(
        f"  picker CPU {cpu_s:.3f} s (user {user_s:.3f} s, kernel {system_s:.3f} s) = {per_poll_us:,.0f} µs per poll"
        f" (user {user_s / max(1, polls) * 1e6:,.0f} µs) = {cpu_s / seconds * 100:.1f} % of a core"
    )
    projected = per_poll_us * 1e-6 * 100 / interval_s * 100
    print(f"  projected for 100 endpoints at this interval: {projected:.0f} % of a core")


async def _poll_for(ports: list[int], seconds: float, interval_s: float) -> tuple[int, float, float]:
    """Run the real poller; return (polls, user CPU seconds, kernel CPU seconds) after a 1 s warm-up."""
    from picker.scrape import poller  # the HTTP client only when polling

    store = EndpointStore()
    store.set_endpoints(
        Endpoint.create(f"10.0.0.{i + 1}", 8000, metrics_url=f"http://127.0.0.1:{port}/metrics")
        for i, port in enumerate(ports)
    )
    settings = ScrapeSettings(interval_s=interval_s)
    task = asyncio.create_task(poller.run(store=store, settings=settings, clock=time.monotonic))
    await asyncio.sleep(1.0)  # warm up: connections, first pages
    polls0, before = _scrape_count(), resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.sleep(seconds)
    polls, after = _scrape_count() - polls0, resource.getrusage(resource.RUSAGE_SELF)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return int(polls), after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime


def _scrape_count() -> float:
    return REGISTRY.get_sample_value("picker_scrape_duration_seconds_count") or 0.0


def _serve(count: int, models: Sequence[str]) -> None:
    """Child process: serve the page of ``models`` at /metrics on ``count`` local ports; print the ports as JSON."""
    from aiohttp import web

    page = vllm_page(models)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/plain")

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        ports = []
        for _ in range(count):
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert isinstance(server, asyncio.Server)
            ports.append(server.sockets[0].getsockname()[1])
        print(json.dumps(ports), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
