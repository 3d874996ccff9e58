"""The policy lab: a workload against N simulated engines in virtual time, with a routing policy in the loop.

    arrivals = poisson_schedule(workloads.shared_prefix(), rate=40, n=10_000, seed=0)
    run = run_lab(LabConfig(preset("h100-8b", num_gpu_blocks=2048), engines=8), "reference", arrivals)
    summarize(run.result)      # the load client's report: the lab returns a LoadResult

No sleeping and no sockets: one heap of events (arrivals, engine step ends, scrapes) on a virtual clock. The
engines are the simulator's ``Engine`` (the same step function as behind ``picker sim``), and the router feeds
the policy what production feeds picker's scheduler:

* each request is the workload's OpenAI body, parsed by the real ``parse_request`` (so prompt text, token
  estimate and max_tokens are exactly what picker would see);
* candidates come from an ``EndpointStore`` whose metrics are updated only at scrapes, every
  ``scrape_interval_s`` (100 ms like ``picker serve``), from ``Engine.stats()`` mapped as the vLLM scrape maps
  the ``/metrics`` page (``scraped_metrics``; a test checks it equals ``scrape.engines.extract`` of the
  simulator's page) — so they are stale like real ones;
* picker's ``InflightTracker`` takes a lease on pick (``director.expected_tokens``), is told the prompt is
  prefilled at the first token (and the TTFT), and is released at completion (and the TPOT), as the director
  does; the policy's ``routed`` / ``completed`` call the scheduler's PreRequest / PostResponse hooks.

Arrivals follow the load client's schedule (``poisson_schedule``: first request at 0, then
``load.poisson_arrivals(rate, seed)``), so the same workload, rate and seed give the same requests in the lab
and live. Network and proxy time are zero. The run is deterministic for a seed (policies draw from a
``random.Random(seed)``; a user plugin that overruns its wall-clock budget is the one exception).
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from picker import errors
from picker.bench.load import LoadResult, LoadSpec, RequestRecord, poisson_arrivals
from picker.bench.policies import Pick, Policy, make_policy
from picker.bench.workloads import Api, WorkItem, Workload
from picker.control.director import expected_tokens
from picker.endpoints.inflight import InflightTracker, Lease
from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.endpoints.store import EndpointStore
from picker.request.model import InferenceRequest
from picker.request.parse import parse_request
from picker.scheduling.framework import PluginContext, ResponseInfo
from picker.sim import api as sim_api
from picker.sim.config import EngineConfig
from picker.sim.engine import Engine, EngineStats, RequestRejected, RequestState, SimRequest
from picker.sim.tokenizer import default_tokenizer

__all__ = [
    "EPOCH_S",
    "EngineSummary",
    "LabConfig",
    "LabRun",
    "PolicyFactory",
    "poisson_schedule",
    "run_lab",
    "scraped_metrics",
]

EPOCH_S = 1000.0  # virtual time of the first arrival (clocks read > 0, as ``updated_at == 0`` means "never")

_SCRAPE, _ARRIVAL, _STEP = 0, 1, 2  # event kinds; at equal times a scrape comes first, then arrivals
PolicyFactory = Callable[[PluginContext], Policy]
_REJECT_STATUS = {"queue_full": 429, "too_long": 400, "unknown_model": 404, "bad_request": 400}


@dataclass(frozen=True, slots=True)
class LabConfig:
    engine: EngineConfig
    engines: int = 8
    scrape_interval_s: float = 0.1
    api: Api = "completions"
    seed: int = 0  # the policies' random source

    def __post_init__(self) -> None:
        if self.engines < 1 or self.scrape_interval_s <= 0:
            raise ValueError("engines >= 1 and scrape_interval_s > 0")


@dataclass(frozen=True, slots=True)
class EngineSummary:
    name: str
    key: str
    requests: int  # routed there
    prefix_hit_share: float  # the engine's prefix-cache hits / queries, in tokens (recomputes included)
    preemptions: int
    busy_s: float
    steps: int


@dataclass(slots=True)
class LabRun:
    policy: str
    rate: float | None
    result: LoadResult  # records and in-flight samples, as the load client returns them
    engines: tuple[EngineSummary, ...]
    events: int
    wall_s: float  # not part of the JSON (the JSON is deterministic for a seed)

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "rate": self.rate, "engines": [asdict(e) for e in self.engines]}


def poisson_schedule(workload: Iterable[WorkItem], rate: float, n: int, seed: int) -> list[tuple[float, WorkItem]]:
    """The load client's open-loop schedule: item k at ``0, a_1, a_2, ...`` (seconds), ``a`` seeded Poisson."""
    items = list(itertools.islice(iter(workload), n))
    times = itertools.chain([0.0], poisson_arrivals(rate, seed))
    return list(zip(times, items, strict=False))


def scraped_metrics(stats: EngineStats, now: float) -> EndpointMetrics:
    """What picker's vLLM scrape reads from this engine's ``/metrics`` page at ``now``."""
    return EndpointMetrics(
        waiting=stats.waiting,
        running=stats.running,
        kv_usage=min(1.0, max(0.0, stats.kv_usage)),
        running_loras=frozenset(stats.running_loras),
        waiting_loras=frozenset(stats.waiting_loras),
        max_loras=stats.max_loras,
        block_size=stats.block_size,
        num_gpu_blocks=stats.num_gpu_blocks,
        updated_at=now,
    )


@dataclass(slots=True)
class _Live:
    """A routed request inside an engine."""

    record: RequestRecord
    req: InferenceRequest
    pick: Pick
    lease: Lease
    engine: int
    arrival_s: float
    first_token_s: float | None = None


@dataclass(slots=True)
class _Clock:
    now: float = EPOCH_S

    def __call__(self) -> float:
        return self.now


@dataclass
class _Lab:
    config: LabConfig
    policy_spec: str | PolicyFactory
    arrivals: Sequence[tuple[float, WorkItem]]
    clock: _Clock = field(default_factory=_Clock)
    inflight: InflightTracker = field(default_factory=InflightTracker)
    store: EndpointStore = field(default_factory=EndpointStore)

    def __post_init__(self) -> None:
        cfg = self.config
        self.ctx = PluginContext(clock=self.clock, inflight=self.inflight, rng=random.Random(cfg.seed))
        spec = self.policy_spec
        self.policy: Policy = make_policy(spec, self.ctx) if isinstance(spec, str) else spec(self.ctx)
        self.engines = [Engine(cfg.engine) for _ in range(cfg.engines)]
        self.endpoints = [
            Endpoint.create(f"10.0.0.{i + 1}", 8000, name=f"sim-{i}", metrics_url=f"http://10.0.0.{i + 1}:8000/metrics")
            for i in range(cfg.engines)
        ]
        self.index_of = {e.key: i for i, e in enumerate(self.endpoints)}
        self.store.set_endpoints(self.endpoints)
        self.policy.endpoints_changed(frozenset(self.index_of))
        self.model = cfg.engine.model
        self.path = "/v1/chat/completions" if cfg.api == "chat" else "/v1/completions"
        self.kind: sim_api.Kind = "chat" if cfg.api == "chat" else "completions"
        self.tokenizer = default_tokenizer()
        self.parsed: dict[bytes, sim_api.ParsedRequest] = {}  # workloads repeat prompts: tokenise each once
        self.records: list[RequestRecord] = []
        self.live: dict[str, _Live] = {}
        self.routed = [0] * cfg.engines
        self.samples: list[tuple[float, int]] = []
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = itertools.count()
        self.pending_arrivals = 0
        self.events = 0

    def push(self, at: float, kind: int, arg: int) -> None:
        heapq.heappush(self.heap, (at, kind, next(self.seq), arg))

    def run(self) -> None:
        for i, (offset, _) in enumerate(self.arrivals):
            self.push(EPOCH_S + offset, _ARRIVAL, i)
        self.pending_arrivals = len(self.arrivals)
        self.push(EPOCH_S, _SCRAPE, 0)
        heap = self.heap
        while heap:
            at, kind, _, arg = heapq.heappop(heap)
            self.clock.now = at
            self.events += 1
            if kind == _STEP:
                self.step_end(arg, at)
            elif kind == _ARRIVAL:
                self.pending_arrivals -= 1
                self.arrive(arg, at)
            else:
                self.scrape(at)

    # -- events -------------------------------------------------------------------------------------------------

    def scrape(self, now: float) -> None:
        self.store.update_metrics(
            {ep.key: scraped_metrics(eng.stats(), now) for ep, eng in zip(self.endpoints, self.engines, strict=True)}
        )
        self.samples.append((now - EPOCH_S, len(self.live)))
        if self.pending_arrivals or self.live:
            self.push(now + self.config.scrape_interval_s, _SCRAPE, 0)

    def arrive(self, i: int, now: float) -> None:
        _, item = self.arrivals[i]
        rid = f"lab-{i}"
        rec = RequestRecord(i, item.tag, item.model or self.model, now - EPOCH_S)
        self.records.append(rec)
        body = orjson.dumps(item.body(self.config.api, self.model, stream=True))
        headers = {":path": self.path, ":method": "POST", "content-type": "application/json", "x-request-id": rid}
        try:
            req = parse_request(headers, body)
            pick = self.policy.pick(req, self.store.current().candidates())
        except errors.PickerError as exc:
            rec.status, rec.error = exc.status, exc.wire_text
            return
        e = self.index_of[pick.endpoint.key]
        lease = self.inflight.acquire(pick.endpoint.key, expected_tokens(req), now)
        self.policy.routed(req, pick)
        self.routed[e] += 1
        rec.backend = pick.endpoint.name
        engine = self.engines[e]
        try:
            p = self.parse_generate(body)
            engine.submit(SimRequest(rid, p.prompt_ids, p.max_tokens, p.min_tokens, p.ignore_eos, self.lora(p)), now)
        except (sim_api.ApiError, RequestRejected) as exc:
            status = exc.status if isinstance(exc, sim_api.ApiError) else _REJECT_STATUS[exc.kind]
            rec.status, rec.error = status, exc.message
            self.inflight.release(lease)
            self.policy.completed(req, ResponseInfo(endpoint_key=pick.endpoint.key, status=status, duration_s=0.0))
            return
        self.live[rid] = _Live(rec, req, pick, lease, e, now)
        if engine.step_end_s is None:
            self.begin(e, now)

    def step_end(self, e: int, now: float) -> None:
        engine = self.engines[e]
        for state in engine.finish_step():
            live = self.live[state.request_id]
            if live.first_token_s is None:
                self.first_token(live, now)
            elif state.last_itl_s is not None and state.last_itl_s > live.record.max_itl_s:
                live.record.max_itl_s = state.last_itl_s
            if state.finished:
                self.finish(live, state, now)
        if engine.has_work:
            self.begin(e, now)

    def begin(self, e: int, now: float) -> None:
        end = self.engines[e].begin_step(now)
        if end is None:  # work that cannot be scheduled yet (the real driver retries after 1 ms)
            end = now + 0.001
        self.push(end, _STEP, e)

    # -- the director's accounting ------------------------------------------------------------------------------

    def first_token(self, live: _Live, now: float) -> None:
        live.first_token_s = now
        live.record.ttft_s = now - live.arrival_s
        self.inflight.prefilled(live.lease, live.req.prompt_tokens)
        self.inflight.observe(live.lease.endpoint_key, ttft_s=now - live.arrival_s)

    def finish(self, live: _Live, state: RequestState, now: float) -> None:
        del self.live[state.request_id]
        rec = live.record
        n_out = len(state.output_ids)
        rec.e2e_s = now - live.arrival_s
        rec.output_tokens = rec.chunks = n_out
        rec.prompt_tokens = state.prompt_tokens
        rec.cached_tokens = state.cached_tokens
        rec.finish_reason = state.finish_reason
        rec.status = 200
        key = live.lease.endpoint_key
        if live.first_token_s is not None and n_out > 1:
            self.inflight.observe(key, tpot_s=(now - live.first_token_s) / (n_out - 1))
        self.inflight.release(live.lease)
        info = ResponseInfo(
            endpoint_key=key,
            status=200,
            prompt_tokens=state.prompt_tokens,
            completion_tokens=n_out,
            cached_tokens=state.cached_tokens,
            ttft_s=rec.ttft_s,
            duration_s=rec.e2e_s,
        )
        self.policy.completed(live.req, info)

    # -- helpers ------------------------------------------------------------------------------------------------

    def parse_generate(self, body: bytes) -> sim_api.ParsedRequest:
        parsed = self.parsed.get(body)
        if parsed is None:
            parsed = sim_api.parse_generate(self.kind, orjson.loads(body), self.tokenizer, self.model)
            self.parsed[body] = parsed
        return parsed

    def lora(self, parsed: sim_api.ParsedRequest) -> str | None:
        if parsed.model == self.model:
            return None
        if parsed.model not in self.config.engine.lora_adapters:
            raise sim_api.ApiError(404, "NotFoundError", f"The model `{parsed.model}` does not exist.", "model")
        return parsed.model

    def summaries(self) -> tuple[EngineSummary, ...]:
        out = []
        for i, (ep, engine) in enumerate(zip(self.endpoints, self.engines, strict=True)):
            s = engine.stats()
            share = s.prefix_hits_tokens / s.prefix_queries_tokens if s.prefix_queries_tokens else 0.0
            out.append(EngineSummary(ep.name, ep.key, self.routed[i], share, s.preemptions, s.busy_s, s.steps))
        return tuple(out)


def run_lab(
    config: LabConfig,
    policy: str | PolicyFactory,
    arrivals: Sequence[tuple[float, WorkItem]],
    *,
    workload: Workload | str = "workload",
    rate: float | None = None,
) -> LabRun:
    """Run ``arrivals`` (seconds from the start, any order) through ``policy``: a ``policies.make_policy`` name, or
    a factory given the lab's ``PluginContext`` (its clock, in-flight tracker and seeded random source)."""
    ordered = sorted(arrivals, key=lambda a: a[0])
    started = time.perf_counter()
    lab = _Lab(config, policy, ordered)
    lab.run()
    wall = time.perf_counter() - started
    records = sorted(lab.records, key=lambda r: r.index)
    name = workload if isinstance(workload, str) else workload.name
    spec = LoadSpec(
        rate=rate if rate is not None else _mean_rate(ordered),
        max_requests=max(1, len(ordered)),
        api=config.api,
        seed=config.seed,
        sample_interval_s=config.scrape_interval_s,
    )
    duration = max((r.end_s for r in records), default=0.0)
    url = f"lab://{config.engines}x{config.engine.model}"
    result = LoadResult(url, name, spec, config.engine.model, records, duration, lab.samples, 0.0)
    return LabRun(lab.policy.name, rate, result, lab.summaries(), lab.events, wall)


def _mean_rate(arrivals: Sequence[tuple[float, WorkItem]]) -> float:
    if len(arrivals) < 2 or arrivals[-1][0] <= arrivals[0][0]:
        return 1.0
    return (len(arrivals) - 1) / (arrivals[-1][0] - arrivals[0][0])
