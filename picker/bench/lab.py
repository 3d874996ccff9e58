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
* picker's ``InflightTracker`` takes a lease on pick (``director.acquire_lease``), is told the prompt is
  prefilled at the first token (and the TTFT), and is released at completion (and the TPOT), as the director
  does; the policy's ``routed`` / ``completed`` call the scheduler's PreRequest / PostResponse hooks.

Beyond one picker seeing all traffic, a ``LabConfig`` can play what production pools do (``Scenario``): several
independent routers (``replicas``, each with its own in-flight ledger, prefix state and scrape phase; the
gateway spreads requests over them round robin or at random), traffic that bypasses every router
(``external_share`` of the arrivals sent straight to the engines, uniformly or all to one engine), a restart of
every router mid-run (``restart_at_s``: fresh ledger, fresh plugin state, fresh metrics; the engines keep their
queues), and engines slower than the rest (``slowdowns``; ``recover_at_s``: back to full speed from then on).
``LabRun.result`` holds the routed requests only (what the policy decided); ``LabRun.external`` the bypassing
ones.

With a ``precise-prefix-cache-scorer`` in a router's configuration, the engines' KV-cache events reach every
router ``kv_event_delay_s`` after the step that caused them, on the real wire format (``lab_kv``), and each
request carries its token ids as picker's token source attaches them.

A fleet can have prefill/decode roles (``LabConfig.roles``, the engines' ``llm-d.ai/role`` labels): a decision
that names a prefiller (``x-prefiller-host-port``) is played as llm-d's sidecar does, prefill first, then decode
with the KV pulled over the link (``lab_pd``).

``LabConfig.streams`` plays a closed loop instead of the schedule (N streams, each sending its next item when its
previous request ends), and ``LabConfig.pool`` gives each engine its own configuration (a pool of mixed servers).

Arrivals follow the load client's schedule (``poisson_schedule``: first request at 0, then
``load.poisson_arrivals(rate, seed)``), so the same workload, rate and seed give the same requests in the lab
and live. Network and proxy time are zero. The run is deterministic for a seed (policies draw from a
``random.Random(seed)``; a user plugin that overruns its wall-clock budget is the one exception).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import orjson

from picker import errors
from picker.bench import lab_kv, lab_pd
from picker.bench.load import LoadResult, LoadSpec, RequestRecord, poisson_arrivals
from picker.bench.policies import Policy, make_policy
from picker.bench.workloads import Api, WorkItem, Workload
from picker.control.director import acquire_lease
from picker.endpoints.inflight import InflightTracker, Lease
from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.endpoints.peerload import PeerLoads
from picker.endpoints.store import EndpointStore
from picker.peers.exchange import Exchange, ExchangeSettings, prefix_scorers
from picker.request.model import InferenceRequest
from picker.request.parse import parse_request
from picker.scheduling.framework import PluginContext, ResponseInfo
from picker.scheduling.scheduler import Scheduler
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
    "Scenario",
    "poisson_schedule",
    "run_lab",
    "scraped_metrics",
]

EPOCH_S = 1000.0  # virtual time of the first arrival (clocks read > 0, as ``updated_at == 0`` means "never")

# Event kinds; at equal times a restart comes first, then a scrape, then arrivals, then step ends, then the
# wake-ups of idle engines whose KV transfers land, then KV events, then the peer exchange's flushes and deliveries.
_RESTART, _SCRAPE, _ARRIVAL, _STEP, _WAKE, _KV, _FLUSH, _DELIVER, _RECOVER = -1, 0, 1, 2, 3, 4, 5, 6, 7
PolicyFactory = Callable[[PluginContext], Policy]
_REJECT_STATUS = {"queue_full": 429, "too_long": 400, "unknown_model": 404, "bad_request": 400}


@dataclass(frozen=True, slots=True)
class Scenario:
    """How the pool around the routers behaves (the default: one router that sees every request)."""

    replicas: int = 1  # independent routers, each with its own ledger, plugin state and scrapes
    spread: Literal["rr", "random"] = "rr"  # how the gateway spreads requests over the routers
    external_share: float = 0.0  # share of the arrivals sent straight to an engine, bypassing every router
    external_target: int | None = None  # the engine all bypassing traffic goes to; None: uniform
    restart_at_s: float | None = None  # every router restarts at this time (seconds from the first arrival)
    slowdowns: tuple[float, ...] = ()  # engine i's step times are multiplied by slowdowns[i] (missing: 1.0)
    recover_at_s: float | None = None  # the slowed engines run at their preset's speed from this time on
    # The peer exchange between the routers (picker.peers, docs/ha.md): off (independent replicas) by default.
    exchange: bool = False
    exchange_delay_s: float = 0.005  # from a router's flush to the peers applying the batch
    exchange_loss: float = 0.0  # share of batches lost on the way
    exchange_flush_s: float = 0.01  # how often each router flushes (ExchangeSettings.flush_interval_s)

    def __post_init__(self) -> None:
        if self.replicas < 1 or not 0.0 <= self.external_share <= 1.0:
            raise ValueError("replicas >= 1 and external_share in [0, 1]")
        if self.exchange_delay_s < 0 or self.exchange_flush_s <= 0 or not 0.0 <= self.exchange_loss <= 1.0:
            raise ValueError("exchange_delay_s >= 0, exchange_flush_s > 0 and exchange_loss in [0, 1]")
        if any(f <= 0 for f in self.slowdowns) or (self.restart_at_s is not None and self.restart_at_s < 0):
            raise ValueError("slowdowns > 0 and restart_at_s >= 0")
        if self.recover_at_s is not None and self.recover_at_s < 0:
            raise ValueError("recover_at_s >= 0")

    @property
    def plain(self) -> bool:
        return self == Scenario()


@dataclass(frozen=True, slots=True)
class LabConfig:
    engine: EngineConfig
    engines: int = 8
    scrape_interval_s: float = 0.1
    api: Api = "completions"
    seed: int = 0  # the policies' random source
    scenario: Scenario = field(default_factory=Scenario)
    kv_event_delay_s: float = 0.005  # engine step → routers' KV-event indexes (precise scorers only)
    roles: tuple[str, ...] = ()  # engine i's llm-d.ai/role ("" none); empty: no roles (lab_pd)
    # Closed loop: this many streams, each sending its next item when its previous request ends (the arrivals'
    # times are then ignored; the items go out in their order). 0: open loop, every item at its time.
    streams: int = 0
    pool: tuple[EngineConfig, ...] = ()  # engine i's own configuration (a mixed pool); empty: ``engine`` for all

    def __post_init__(self) -> None:
        if self.engines < 1 or self.scrape_interval_s <= 0 or self.kv_event_delay_s < 0:
            raise ValueError("engines >= 1, scrape_interval_s > 0 and kv_event_delay_s >= 0")
        if self.streams < 0:
            raise ValueError("streams must be >= 0 (0: open loop)")
        if self.pool and (len(self.pool) != self.engines or any(c.model != self.engine.model for c in self.pool)):
            raise ValueError("pool: one engine configuration per engine, each serving the same model as engine")
        if self.roles and (len(self.roles) != self.engines or any(r not in lab_pd.ROLES for r in self.roles)):
            raise ValueError(f"roles: one per engine, each one of {lab_pd.ROLES}")
        if self.scenario.external_target is not None and not 0 <= self.scenario.external_target < self.engines:
            raise ValueError("external_target must name an engine")


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
    result: LoadResult  # the routed requests and in-flight samples, as the load client returns them
    engines: tuple[EngineSummary, ...]
    events: int
    wall_s: float  # not part of the JSON (the JSON is deterministic for a seed)
    external: LoadResult | None = None  # requests that bypassed the routers (Scenario.external_share)
    disaggregated: int = 0  # requests prefilled on another engine (P/D fleets)
    exchange_bytes: int = 0  # bytes of peer-exchange batches sent, all routers together (Scenario.exchange)
    exchange_batches: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "rate": self.rate, "engines": [asdict(e) for e in self.engines]}


def poisson_schedule(workload: Iterable[WorkItem], rate: float, n: int, seed: int) -> list[tuple[float, WorkItem]]:
    """The load client's open-loop schedule: item k at ``0, a_1, a_2, ...`` (seconds), ``a`` seeded Poisson."""
    items = list(itertools.islice(iter(workload), n))
    times = itertools.chain([0.0], poisson_arrivals(rate, seed))
    return list(zip(times, items, strict=False))


def scraped_metrics(stats: EngineStats, now: float, own_requests: int | None = None) -> EndpointMetrics:
    """What picker's vLLM scrape reads from this engine's ``/metrics`` page at ``now`` (``own_requests``: the
    router's own in-flight count there at that moment, as the poller notes it)."""
    return EndpointMetrics(
        waiting=stats.waiting,
        running=stats.running,
        kv_usage=min(1.0, max(0.0, stats.kv_usage)),
        running_loras=frozenset(stats.running_loras),
        waiting_loras=frozenset(stats.waiting_loras),
        max_loras=stats.max_loras,
        block_size=stats.block_size,
        num_gpu_blocks=stats.num_gpu_blocks,
        generated_tokens=stats.generated_tokens,
        prefix_query_tokens=stats.lookup_queries_tokens,
        prefix_hit_tokens=stats.lookup_hits_tokens,
        updated_at=now,
        own_requests=own_requests,
    )


class _Router:
    """One picker (or baseline router) instance: its ledger, its view of the endpoints, its policy."""

    def __init__(self, lab: _Lab, index: int, policy_seed: int, incarnation: int = 0) -> None:
        self.index = index
        self.inflight = InflightTracker()
        self.store = EndpointStore()
        scenario = lab.config.scenario
        settings = ExchangeSettings(flush_interval_s=scenario.exchange_flush_s)
        peer_loads = PeerLoads(settings.state_ttl_s) if scenario.exchange else None
        self.ctx = PluginContext(
            clock=lab.clock, inflight=self.inflight, rng=random.Random(policy_seed), peers=peer_loads
        )
        spec = lab.policy_spec
        self.policy: Policy = make_policy(spec, self.ctx) if isinstance(spec, str) else spec(self.ctx)
        self.store.set_endpoints(lab.endpoints)
        self.policy.endpoints_changed(frozenset(lab.index_of))
        self.kv_ingestor = lab_kv.ingestor_for(self.policy, list(lab.index_of))
        self.exchange: Exchange | None = None
        if peer_loads is not None:
            scheduler = getattr(self.policy, "scheduler", None)
            scorers = prefix_scorers(scheduler.config.plugins) if isinstance(scheduler, Scheduler) else {}
            self.exchange = Exchange(
                scorers=scorers, inflight=self.inflight, peer_loads=peer_loads, store=self.store,
                settings=settings, incarnation=incarnation,
            )  # fmt: skip
            self.exchange.set_peers(str(r) for r in range(scenario.replicas) if r != index)


@dataclass(slots=True)
class _Live:
    """A request inside an engine; ``router`` is None for one that bypassed the routers."""

    record: RequestRecord
    req: InferenceRequest | None
    router: _Router | None
    lease: Lease | None
    engine: int
    arrival_s: float
    first_token_s: float | None = None
    prefill_lease: Lease | None = None  # on the engine prefilling it (P/D), until its first token


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

    def __post_init__(self) -> None:
        cfg = self.config
        scenario = cfg.scenario
        configs = cfg.pool or (cfg.engine,) * cfg.engines
        self.engines = [
            Engine(c if i >= len(scenario.slowdowns) else c.replace(slowdown=scenario.slowdowns[i]))
            for i, c in enumerate(configs)
        ]
        self.endpoints = [
            Endpoint.create(
                f"10.0.0.{i + 1}",
                8000,
                name=f"sim-{i}",
                metrics_url=f"http://10.0.0.{i + 1}:8000/metrics",
                labels=lab_pd.role_labels(cfg.roles[i]) if cfg.roles else None,
            )
            for i in range(cfg.engines)
        ]
        self.index_of = {e.key: i for i, e in enumerate(self.endpoints)}
        # Router r draws from Random(seed + r): one router draws exactly what the lab always drew.
        self.routers = [_Router(self, r, cfg.seed + r, r + 1) for r in range(scenario.replicas)]
        self.deliveries: dict[int, tuple[int, bytes]] = {}  # delivery id -> (router index, batch)
        self.exchange_rng = random.Random(f"exchange-{cfg.seed}")
        self.exchange_bytes = self.exchange_batches = 0
        self.restarts = 0
        # The pool's own randomness (external traffic, the gateway's spread) has a stream of its own, so a
        # scenario does not shift the policies' draws.
        self.pool_rng = random.Random(f"pool-{cfg.seed}")
        self.next_router = 0
        self.model = cfg.engine.model
        self.path = "/v1/chat/completions" if cfg.api == "chat" else "/v1/completions"
        self.kind: sim_api.Kind = "chat" if cfg.api == "chat" else "completions"
        self.tokenizer = default_tokenizer()
        self.parsed: dict[bytes, sim_api.ParsedRequest] = {}  # workloads repeat prompts: tokenise each once
        self.records: list[RequestRecord] = []
        self.external: list[RequestRecord] = []
        self.live: dict[str, _Live] = {}
        # P/D: a prefill leg's engine request id -> the request's id and body (its decode leg follows)
        self.prefilling: dict[str, tuple[str, bytes]] = {}
        self.routed = [0] * cfg.engines
        self.samples: list[tuple[float, int]] = []
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = itertools.count()
        self.pending_arrivals = 0
        self.events = 0
        self.kv_bus: lab_kv.EventBus | None = None
        if any(r.kv_ingestor is not None for r in self.routers):
            self.kv_bus = lab_kv.EventBus(
                self.engines,
                [f"kv@{ep.key}@{self.model}".encode() for ep in self.endpoints],
                cfg.engine.block_size,
                {name: i + 1 for i, name in enumerate(cfg.engine.lora_adapters)},
                cfg.kv_event_delay_s,
            )
        self.disaggregated = 0
        self.next_item = 0  # closed loop: the next item a stream sends

    @property
    def policy_name(self) -> str:
        return self.routers[0].policy.name

    def push(self, at: float, kind: int, arg: int) -> None:
        heapq.heappush(self.heap, (at, kind, next(self.seq), arg))

    def run(self) -> None:
        cfg = self.config
        opening = self.arrivals[: cfg.streams] if cfg.streams else self.arrivals
        for i, (offset, _) in enumerate(opening):
            self.push(EPOCH_S if cfg.streams else EPOCH_S + offset, _ARRIVAL, i)
        self.next_item = len(opening)
        self.pending_arrivals = len(self.arrivals)
        # Router r scrapes r/N of an interval after router 0: independent pollers are not in phase.
        for r in range(len(self.routers)):
            self.push(EPOCH_S + cfg.scrape_interval_s * r / len(self.routers), _SCRAPE, r)
        if cfg.scenario.restart_at_s is not None:
            self.push(EPOCH_S + cfg.scenario.restart_at_s, _RESTART, 0)
        if cfg.scenario.recover_at_s is not None:
            self.push(EPOCH_S + cfg.scenario.recover_at_s, _RECOVER, 0)
        if cfg.scenario.exchange and len(self.routers) > 1:
            for r in range(len(self.routers)):
                self.push(EPOCH_S + cfg.scenario.exchange_flush_s * (r + 1) / len(self.routers), _FLUSH, r)
        heap = self.heap
        while heap:
            at, kind, _, arg = heapq.heappop(heap)
            self.clock.now = at
            self.events += 1
            if kind == _STEP:
                self.step_end(arg, at)
            elif kind == _WAKE:
                self.wake(arg, at)
            elif kind == _ARRIVAL:
                self.pending_arrivals -= 1
                self.arrive(arg, at)
            elif kind == _SCRAPE:
                self.scrape(arg, at)
            elif kind == _KV:
                assert self.kv_bus is not None
                self.kv_bus.deliver(arg, [r.kv_ingestor for r in self.routers])
            elif kind == _FLUSH:
                self.flush(arg, at)
            elif kind == _DELIVER:
                self.deliver(arg, at)
            elif kind == _RECOVER:
                for engine in self.engines:  # a step under way keeps its length; the next ones are the preset's
                    engine.config = engine.config.replace(slowdown=1.0)
            else:
                self.restart(at)

    # -- events -------------------------------------------------------------------------------------------------

    def scrape(self, r: int, now: float) -> None:
        self.scrape_into(self.routers[r], now)
        if r == 0:
            self.samples.append((now - EPOCH_S, len(self.live)))
        if self.pending_arrivals or self.live:
            self.push(now + self.config.scrape_interval_s, _SCRAPE, r)

    def flush(self, r: int, now: float) -> None:
        """Router r's peer exchange sends its batches; each arrives ``exchange_delay_s`` later, unless lost."""
        scenario = self.config.scenario
        exchange = self.routers[r].exchange
        if exchange is not None:
            for peer, batches in exchange.flush(now).items():
                for data in batches:
                    self.exchange_bytes += len(data)
                    self.exchange_batches += 1
                    if scenario.exchange_loss and self.exchange_rng.random() < scenario.exchange_loss:
                        continue
                    delivery = next(self.seq)
                    self.deliveries[delivery] = (int(peer), data)
                    self.push(now + scenario.exchange_delay_s, _DELIVER, delivery)
        if self.pending_arrivals or self.live:
            self.push(now + scenario.exchange_flush_s, _FLUSH, r)

    def deliver(self, delivery: int, now: float) -> None:
        r, data = self.deliveries.pop(delivery)
        exchange = self.routers[r].exchange
        if exchange is not None:
            exchange.receive(data, now)

    def scrape_into(self, router: _Router, now: float) -> None:
        router.store.update_metrics(
            {
                ep.key: scraped_metrics(eng.stats(), now, router.ctx.ledger_requests(ep.key))
                for ep, eng in zip(self.endpoints, self.engines, strict=True)
            }
        )

    def restart(self, now: float) -> None:
        """Every router starts afresh (a rollout of picker): requests already routed finish into the old
        routers, which nothing reads any more; the new ones scrape at once, as a starting poller does."""
        self.restarts += 1
        for r in range(len(self.routers)):
            seed = self.config.seed + r + 1000 * self.restarts
            self.routers[r] = router = _Router(self, r, seed, r + 1 + 1000 * self.restarts)
            self.scrape_into(router, now)

    def arrive(self, i: int, now: float) -> None:
        _, item = self.arrivals[i]
        rid = f"lab-{i}"
        rec = RequestRecord(i, item.tag, item.model or self.model, now - EPOCH_S)
        body = orjson.dumps(item.body(self.config.api, self.model, stream=True))
        scenario = self.config.scenario
        if scenario.external_share and self.pool_rng.random() < scenario.external_share:
            self.external.append(rec)
            target = scenario.external_target
            e = target if target is not None else self.pool_rng.randrange(len(self.engines))
            rec.backend = self.endpoints[e].name
            self.submit(e, rid, rec, body, None, None, None, now)
            return
        self.records.append(rec)
        router = self.pick_router()
        headers = {
            **dict(item.headers),
            ":path": self.path,
            ":method": "POST",
            "content-type": "application/json",
            "x-request-id": rid,
        }
        try:
            req = parse_request(headers, body)
            if router.kv_ingestor is not None:  # the director's token source
                req = dataclasses.replace(req, token_ids=self.parse_generate(body).prompt_ids)
            pick = router.policy.pick(req, router.store.current().candidates())
        except errors.PickerError as exc:
            rec.status, rec.error = exc.status, exc.wire_text
            self.ended(now)
            return
        e = self.index_of[pick.endpoint.key]
        lease = acquire_lease(router.inflight, pick.endpoint.key, req, pick.result, now)
        router.policy.routed(req, pick)
        self.routed[e] += 1
        rec.backend = pick.endpoint.name
        policy = router.policy
        upstream: Mapping[str, str] = {}
        if isinstance(policy, lab_pd.SetsRequestHeaders):
            upstream = policy.request_headers(req, pick)
        p = self.index_of.get(lab_pd.prefiller_of(upstream), e)
        if p != e:  # disaggregated: the decode engine's sidecar sends the prefill first
            prefill_lease = router.inflight.acquire(self.endpoints[p].key, req.prompt_tokens + 1, now)
            self.submit_prefill(p, e, rid, rec, body, req, router, lease, prefill_lease, now)
            return
        self.submit(e, rid, rec, body, req, router, lease, now)

    def pick_router(self) -> _Router:
        n = len(self.routers)
        if n == 1:
            return self.routers[0]
        if self.config.scenario.spread == "random":
            return self.routers[self.pool_rng.randrange(n)]
        self.next_router = (self.next_router + 1) % n
        return self.routers[self.next_router]

    def submit(
        self,
        e: int,
        rid: str,
        rec: RequestRecord,
        body: bytes,
        req: InferenceRequest | None,
        router: _Router | None,
        lease: Lease | None,
        now: float,
    ) -> None:
        engine = self.engines[e]
        try:
            p = self.parse_generate(body)
            engine.submit(SimRequest(rid, p.prompt_ids, p.max_tokens, p.min_tokens, p.ignore_eos, self.lora(p)), now)
        except (sim_api.ApiError, RequestRejected) as exc:
            status = exc.status if isinstance(exc, sim_api.ApiError) else _REJECT_STATUS[exc.kind]
            rec.status, rec.error = status, exc.message
            self.ended(now)
            if router is not None and lease is not None and req is not None:
                router.inflight.release(lease)
                info = ResponseInfo(endpoint_key=self.endpoints[e].key, status=status, duration_s=0.0)
                router.policy.completed(req, info)
            return
        self.live[rid] = _Live(rec, req, router, lease, e, now)
        if engine.step_end_s is None:
            self.begin(e, now)

    def submit_prefill(
        self,
        p: int,
        e: int,
        rid: str,
        rec: RequestRecord,
        body: bytes,
        req: InferenceRequest,
        router: _Router,
        lease: Lease,
        prefill_lease: Lease,
        now: float,
    ) -> None:
        """The sidecar's prefill: the prompt with max_tokens 1 on engine ``p``; the decode leg follows."""
        engine = self.engines[p]
        leg = rid + lab_pd.PREFILL_SUFFIX
        try:
            parsed = self.parse_generate(body)
            engine.submit(SimRequest(leg, parsed.prompt_ids, 1, 0, True, self.lora(parsed)), now)
        except (sim_api.ApiError, RequestRejected) as exc:  # the sidecar relays the prefill's error
            status = exc.status if isinstance(exc, sim_api.ApiError) else _REJECT_STATUS[exc.kind]
            self.fail(_Live(rec, req, router, lease, e, now, prefill_lease=prefill_lease), status, exc.message)
            return
        self.live[rid] = _Live(rec, req, router, lease, e, now, prefill_lease=prefill_lease)
        self.prefilling[leg] = (rid, body)
        self.disaggregated += 1
        if engine.step_end_s is None:
            self.begin(p, now)

    def prefilled(self, rid: str, body: bytes, now: float) -> None:
        """The prefill leg is done: the decode engine gets the request, its prompt's KV to pull."""
        live = self.live[rid]
        engine = self.engines[live.engine]
        parsed = self.parse_generate(body)
        try:
            engine.submit(
                SimRequest(
                    rid, parsed.prompt_ids, parsed.max_tokens, parsed.min_tokens, parsed.ignore_eos,
                    self.lora(parsed), remote_prefill=True,
                ),
                now,
            )  # fmt: skip
        except RequestRejected as exc:
            del self.live[rid]
            self.fail(live, _REJECT_STATUS[exc.kind], exc.message)
            return
        if engine.step_end_s is None:
            self.begin(live.engine, now)

    def fail(self, live: _Live, status: int, message: str) -> None:
        """A routed request failed before any token: the client's error, the router's leases given back."""
        live.record.status, live.record.error = status, message
        self.ended(self.clock.now)
        router, req = live.router, live.req
        if router is None or req is None:
            return
        for lease in (live.lease, live.prefill_lease):
            if lease is not None:
                router.inflight.release(lease)
        info = ResponseInfo(endpoint_key=self.endpoints[live.engine].key, status=status, duration_s=0.0)
        router.policy.completed(req, info)

    def wake(self, e: int, now: float) -> None:
        """An idle engine's KV transfer landed: start a step if it is still idle."""
        engine = self.engines[e]
        if engine.step_end_s is None and engine.has_work:
            self.begin(e, now)

    def step_end(self, e: int, now: float) -> None:
        engine = self.engines[e]
        for state in engine.finish_step():
            if self.prefilling:
                leg = self.prefilling.pop(state.request_id, None)
                if leg is not None:  # a prefill leg's only token: the prefill is done
                    self.prefilled(*leg, now)
                    continue
            live = self.live[state.request_id]
            if live.first_token_s is None:
                self.first_token(live, now)
            elif state.last_itl_s is not None and state.last_itl_s > live.record.max_itl_s:
                live.record.max_itl_s = state.last_itl_s
            if state.finished:
                self.finish(live, state, now)
        if engine.has_work:
            self.begin(e, now)
        self.publish_kv(e, now)

    def begin(self, e: int, now: float) -> None:
        engine = self.engines[e]
        end = engine.begin_step(now)
        if end is None:  # nothing to compute until a KV transfer lands (the real driver sleeps until then)
            wake = engine.next_wakeup_s
            self.push(wake if wake is not None else now + 0.001, _WAKE, e)
            return
        self.push(end, _STEP, e)

    def publish_kv(self, e: int, now: float) -> None:
        """After a step: what it stored and evicted goes out as one batch (and the next step's allocations)."""
        if self.kv_bus is not None and (msg := self.kv_bus.drain(e, now)) is not None:
            self.push(now + self.kv_bus.delay_s, _KV, msg)

    # -- the director's accounting ------------------------------------------------------------------------------

    def first_token(self, live: _Live, now: float) -> None:
        live.first_token_s = now
        live.record.ttft_s = now - live.arrival_s
        if live.router is not None and live.prefill_lease is not None:
            live.router.inflight.release(live.prefill_lease)  # prefilled: the director releases it here
        if live.router is None or live.lease is None or live.req is None:
            return
        live.router.inflight.prefilled(live.lease, live.req.prompt_tokens, now)
        live.router.inflight.observe(live.lease.endpoint_key, ttft_s=now - live.arrival_s)
        info = ResponseInfo(endpoint_key=live.lease.endpoint_key, ttft_s=now - live.arrival_s)
        live.router.policy.first_token(live.req, info)

    def ended(self, now: float) -> None:
        """A request ended (answered or failed): in a closed loop, its stream sends the next item now."""
        if self.config.streams and self.next_item < len(self.arrivals):
            self.push(now, _ARRIVAL, self.next_item)
            self.next_item += 1

    def finish(self, live: _Live, state: RequestState, now: float) -> None:
        del self.live[state.request_id]
        self.ended(now)
        rec = live.record
        n_out = len(state.output_ids)
        rec.e2e_s = now - live.arrival_s
        rec.output_tokens = rec.chunks = n_out
        rec.prompt_tokens = state.prompt_tokens
        rec.cached_tokens = state.cached_tokens
        rec.finish_reason = state.finish_reason
        rec.status = 200
        router, lease, req = live.router, live.lease, live.req
        if router is None or lease is None or req is None:
            return
        if live.prefill_lease is not None:
            router.inflight.release(live.prefill_lease)
        key = lease.endpoint_key
        if live.first_token_s is not None and n_out > 1:
            router.inflight.observe(key, tpot_s=(now - live.first_token_s) / (n_out - 1))
        router.inflight.release(lease)
        info = ResponseInfo(
            endpoint_key=key,
            status=200,
            prompt_tokens=state.prompt_tokens,
            completion_tokens=n_out,
            cached_tokens=state.cached_tokens,
            ttft_s=rec.ttft_s,
            duration_s=rec.e2e_s,
        )
        router.policy.completed(req, info)

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
    external = sorted(lab.external, key=lambda r: r.index)
    name = workload if isinstance(workload, str) else workload.name
    closed = config.streams > 0
    spec = LoadSpec(
        rate=None if closed else (rate if rate is not None else _mean_rate(ordered)),
        concurrency=config.streams if closed else None,
        max_requests=max(1, len(ordered)),
        api=config.api,
        seed=config.seed,
        sample_interval_s=config.scrape_interval_s,
    )
    duration = max((r.end_s for r in records), default=0.0)
    url = f"lab://{config.engines}x{config.engine.model}"
    result = LoadResult(url, name, spec, config.engine.model, records, duration, lab.samples, 0.0)
    bypass = LoadResult(url, name, spec, config.engine.model, external, duration, [], 0.0) if external else None
    return LabRun(
        lab.policy_name, rate, result, lab.summaries(), lab.events, wall, bypass, lab.disaggregated,
        lab.exchange_bytes, lab.exchange_batches,
    )  # fmt: skip


def _mean_rate(arrivals: Sequence[tuple[float, WorkItem]]) -> float:
    if len(arrivals) < 2 or arrivals[-1][0] <= arrivals[0][0]:
        return 1.0
    return (len(arrivals) - 1) / (arrivals[-1][0] - arrivals[0][0])
