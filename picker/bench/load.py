"""The load client as a library: streamed requests at a Poisson rate or a fixed concurrency, one record each.

    result = await run_load("http://127.0.0.1:8000", workloads.shared_prefix(), LoadSpec(rate=5, max_requests=200))

Open loop (``rate``): arrivals are a seeded Poisson process, each request its own task, so a slow server does
not slow the arrivals. Closed loop (``concurrency``): N workers, each sending its next request when the last one
ends. Either way the run is bounded: at most ``max_requests`` requests, none issued after ``max_duration_s``,
and requests still running ``drain_s`` later are cancelled (recorded as errors).

Per request: TTFT (first chunk with text), TPOT ((e2e - TTFT) / (tokens - 1)), e2e, output tokens (the server's
``usage`` when sent, else the number of text chunks: one token per chunk), prompt and cached tokens from
``usage``, the largest inter-chunk gap, and which backend answered (``x-backend`` / ``x-inference-pod``). The
number of requests in flight is sampled every ``sample_interval_s`` for the Little's-law check in ``report``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import aiohttp
import orjson

from picker.bench.workloads import Api, WorkItem

__all__ = [
    "LoadResult",
    "LoadSpec",
    "RequestRecord",
    "detokenize",
    "fetch_models",
    "merge_results",
    "poisson_arrivals",
    "run_load",
    "tokenize",
]


@dataclass(frozen=True, slots=True)
class LoadSpec:
    rate: float | None = None  # requests/s, Poisson arrivals
    concurrency: int | None = None  # closed loop
    max_requests: int = 100
    max_duration_s: float = 60.0
    drain_s: float = 30.0
    timeout_s: float = 120.0  # per request
    api: Api = "completions"
    model: str | None = None  # None: the first model of GET /v1/models
    stream: bool = True
    seed: int = 0
    sample_interval_s: float = 0.05
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ValueError("give exactly one of rate and concurrency")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be > 0")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.max_requests < 1 or self.max_duration_s <= 0 or self.timeout_s <= 0 or self.drain_s < 0:
            raise ValueError("max_requests >= 1, max_duration_s > 0, timeout_s > 0, drain_s >= 0")


@dataclass(slots=True)
class RequestRecord:
    index: int
    tag: str
    model: str
    start_s: float  # since the run started
    e2e_s: float = 0.0
    ttft_s: float | None = None
    output_tokens: int = 0
    chunks: int = 0  # SSE chunks that carried text
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    max_itl_s: float = 0.0
    finish_reason: str | None = None
    status: int = 0  # HTTP status; 0 = no response
    error: str | None = None
    backend: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def end_s(self) -> float:
        return self.start_s + self.e2e_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(slots=True)
class LoadResult:
    url: str
    workload: str
    spec: LoadSpec
    model: str
    records: list[RequestRecord] = field(default_factory=list)
    duration_s: float = 0.0  # run start to the last request's end
    inflight_samples: list[tuple[float, int]] = field(default_factory=list)
    t0: float = 0.0  # time.perf_counter() at the run's start (aligns runs made side by side)


def merge_results(results: Sequence[LoadResult]) -> LoadResult:
    """Runs made at the same time against several URLs, as one run (rate/concurrency/caps summed)."""
    if not results:
        raise ValueError("nothing to merge")
    if len(results) == 1:
        return results[0]
    base = min(r.t0 for r in results)
    records: list[RequestRecord] = []
    per_run: list[dict[int, int]] = []
    interval = results[0].spec.sample_interval_s
    for res in results:
        shift = res.t0 - base
        records.extend(dataclasses.replace(rec, start_s=rec.start_s + shift) for rec in res.records)
        per_run.append({int((t + shift) / interval): n for t, n in res.inflight_samples})
    records.sort(key=lambda r: r.start_s)
    for i, rec in enumerate(records):
        rec.index = i
    buckets = sorted(set().union(*per_run))
    samples = [(k * interval, sum(run.get(k, 0) for run in per_run)) for k in buckets]
    spec, n = results[0].spec, len(results)
    spec = dataclasses.replace(
        spec,
        rate=None if spec.rate is None else spec.rate * n,
        concurrency=None if spec.concurrency is None else spec.concurrency * n,
        max_requests=spec.max_requests * n,
    )
    duration = max((r.end_s for r in records), default=0.0)
    url = ",".join(r.url for r in results)
    return LoadResult(url, results[0].workload, spec, results[0].model, records, duration, samples, base)


async def fetch_models(base_url: str, session: aiohttp.ClientSession) -> list[str]:
    async with session.get(f"{base_url}/v1/models") as resp:
        resp.raise_for_status()
        body = orjson.loads(await resp.read())
    return [m["id"] for m in body.get("data", [])]


@overload
async def tokenize(base_url: str, text: str, session: aiohttp.ClientSession, model: str | None = None) -> list[int]: ...
@overload
async def tokenize(
    base_url: str, text: str, session: aiohttp.ClientSession, model: str | None, *, with_pieces: Literal[True]
) -> tuple[list[int], list[str] | None]: ...
async def tokenize(
    base_url: str, text: str, session: aiohttp.ClientSession, model: str | None = None, *, with_pieces: bool = False
) -> list[int] | tuple[list[int], list[str] | None]:
    """Token ids of ``text`` from the server's ``/tokenize`` (and each token's text, if it returns them)."""
    payload: dict[str, Any] = {"prompt": text}
    if model:
        payload["model"] = model
    if with_pieces:
        payload["return_token_strs"] = True
    async with session.post(f"{base_url}/tokenize", data=orjson.dumps(payload), headers=_JSON) as resp:
        resp.raise_for_status()
        body = orjson.loads(await resp.read())
    tokens = [int(t) for t in body["tokens"]]
    if not with_pieces:
        return tokens
    strs = body.get("token_strs")
    return tokens, ([str(s) for s in strs] if isinstance(strs, list) else None)


async def detokenize(base_url: str, tokens: list[int], session: aiohttp.ClientSession, model: str | None = None) -> str:
    payload: dict[str, Any] = {"tokens": tokens}
    if model:
        payload["model"] = model
    async with session.post(f"{base_url}/detokenize", data=orjson.dumps(payload), headers=_JSON) as resp:
        resp.raise_for_status()
        return str(orjson.loads(await resp.read())["prompt"])


_JSON = {"Content-Type": "application/json"}


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    rec: RequestRecord,
    spec: LoadSpec,
    headers: Mapping[str, str],
) -> None:
    t0 = time.perf_counter()
    last: float | None = None
    usage: dict[str, Any] | None = None
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    try:
        async with session.post(url, data=orjson.dumps(body), headers=headers, timeout=timeout) as resp:
            rec.status = resp.status
            rec.backend = resp.headers.get("x-backend") or resp.headers.get("x-inference-pod")
            if resp.status != 200:
                rec.error = _error_text(await resp.read())
                return
            if not spec.stream:
                obj = orjson.loads(await resp.read())
                rec.ttft_s = time.perf_counter() - t0
                usage = obj.get("usage")
                choice = (obj.get("choices") or [{}])[0]
                rec.finish_reason = choice.get("finish_reason")
                rec.chunks = 1
            else:
                async for line in resp.content:
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        break
                    now = time.perf_counter()
                    obj = orjson.loads(data)
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for choice in obj.get("choices") or ():
                        text = choice.get("text")
                        if text is None:
                            text = (choice.get("delta") or {}).get("content")
                        if text:
                            rec.chunks += 1
                            if last is None:
                                rec.ttft_s = now - t0
                            else:
                                rec.max_itl_s = max(rec.max_itl_s, now - last)
                            last = now
                        if choice.get("finish_reason"):
                            rec.finish_reason = choice["finish_reason"]
    except TimeoutError:
        rec.error = "timeout"
    except (aiohttp.ClientError, orjson.JSONDecodeError, ValueError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    except asyncio.CancelledError:
        rec.error = "cancelled"
        raise
    finally:
        rec.e2e_s = time.perf_counter() - t0
        if usage:
            rec.output_tokens = int(usage.get("completion_tokens") or 0)
            rec.prompt_tokens = usage.get("prompt_tokens")
            rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        else:
            rec.output_tokens = rec.chunks
        if rec.error is None and rec.status == 200 and rec.ttft_s is None:
            rec.error = "no tokens"


def poisson_arrivals(rate: float, seed: int) -> Iterator[float]:
    """Arrival times (s since the start) of a seeded Poisson process; the first request goes at 0."""
    rng = random.Random(seed)
    at = 0.0
    while True:
        at += rng.expovariate(rate)
        yield at


def _error_text(raw: bytes) -> str:
    try:
        err = orjson.loads(raw).get("error")
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
    except (orjson.JSONDecodeError, AttributeError):
        pass
    return raw[:300].decode("utf-8", errors="replace")


class _Run:
    """State of one run: the item stream, counters, records."""

    def __init__(
        self,
        base_url: str,
        items: Iterator[WorkItem],
        spec: LoadSpec,
        model: str,
        session: aiohttp.ClientSession,
        on_record: Callable[[RequestRecord], None] | None,
    ) -> None:
        self.url = f"{base_url}/v1/{'chat/completions' if spec.api == 'chat' else 'completions'}"
        self.items = items
        self.spec = spec
        self.model = model
        self.session = session
        self.on_record = on_record
        self.headers = {**_JSON, **dict(spec.headers)}
        self.records: list[RequestRecord] = []
        self.issued = 0
        self.inflight = 0
        self.samples: list[tuple[float, int]] = []
        self.t0 = time.perf_counter()

    def next_item(self) -> tuple[int, WorkItem] | None:
        if self.issued >= self.spec.max_requests or time.perf_counter() - self.t0 >= self.spec.max_duration_s:
            return None
        item = next(self.items, None)
        if item is None:
            return None
        self.issued += 1
        return self.issued - 1, item

    async def one(self, index: int, item: WorkItem) -> None:
        rec = RequestRecord(index, item.tag, item.model or self.model, time.perf_counter() - self.t0)
        self.records.append(rec)
        self.inflight += 1
        try:
            body = item.body(self.spec.api, self.model, stream=self.spec.stream)
            await _send(self.session, self.url, body, rec, self.spec, self.headers)
        finally:
            self.inflight -= 1
            if self.on_record is not None:
                self.on_record(rec)

    async def open_loop(self) -> None:
        assert self.spec.rate is not None
        arrivals = poisson_arrivals(self.spec.rate, self.spec.seed)
        tasks: set[asyncio.Task[None]] = set()
        try:
            while (nxt := self.next_item()) is not None:
                tasks.add(asyncio.create_task(self.one(*nxt)))
                tasks = {t for t in tasks if not t.done()}
                at = next(arrivals)
                if at >= self.spec.max_duration_s:
                    break
                await asyncio.sleep(max(0.0, at - (time.perf_counter() - self.t0)))
            await self._drain(tasks)
        finally:
            for t in tasks:
                t.cancel()

    async def closed_loop(self) -> None:
        assert self.spec.concurrency is not None

        async def worker() -> None:
            while (nxt := self.next_item()) is not None:
                await self.one(*nxt)

        workers = {asyncio.create_task(worker()) for _ in range(self.spec.concurrency)}
        try:
            remaining = self.spec.max_duration_s - (time.perf_counter() - self.t0)
            _, pending = await asyncio.wait(workers, timeout=max(0.0, remaining))
            await self._drain(pending)
        finally:
            for t in workers:
                t.cancel()

    async def _drain(self, tasks: Iterable[asyncio.Task[None]]) -> None:
        pending = [t for t in tasks if not t.done()]
        if pending:
            _, late = await asyncio.wait(pending, timeout=self.spec.drain_s)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late)

    async def sample(self) -> None:
        while True:
            self.samples.append((time.perf_counter() - self.t0, self.inflight))
            await asyncio.sleep(self.spec.sample_interval_s)


async def run_load(
    base_url: str,
    workload: Iterable[WorkItem],
    spec: LoadSpec,
    *,
    session: aiohttp.ClientSession | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
    workload_name: str | None = None,
) -> LoadResult:
    """Drive ``workload`` at ``base_url`` as ``spec`` says; returns every request's record (in issue order)."""
    base_url = base_url.rstrip("/")
    own = session is None
    if session is None:
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        model = spec.model or next(iter(await fetch_models(base_url, session)), None)
        if model is None:
            raise ValueError(f"{base_url}/v1/models lists no model")
        run = _Run(base_url, iter(workload), spec, model, session, on_record)
        sampler = asyncio.create_task(run.sample())
        try:
            await (run.open_loop() if spec.rate is not None else run.closed_loop())
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
    finally:
        if own:
            await session.close()
    records = sorted(run.records, key=lambda r: r.index)
    duration = max((r.end_s for r in records), default=0.0)
    name = workload_name or str(getattr(workload, "name", "workload"))
    return LoadResult(base_url, name, spec, model, records, duration, run.samples, run.t0)
