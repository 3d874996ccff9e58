"""The director: one request's flow from a parsed ``InferenceRequest`` to a destination, and back at completion.

route:     candidates (snapshot, subset hint) → model rewrite header → resolver (objective priority,
           InferenceModelRewrite; a seam, identity by default) → admission (a seam, admits all by default)
           → token ids (a seam, for the precise prefix scorer; none by default) → scheduler → in-flight lease
           → PreRequest plugins.
complete:  release the lease, observe TTFT/TPOT, record metrics, PostResponse plugins.

Request headers that plugins set (``RequestHeaders``: the disaggregation handler's ``x-prefiller-host-port``)
ride on ``Routed.headers``. A request with a prefiller is prefilled there by the decode pod's sidecar before it
decodes: picker holds a second lease on the prefill endpoint for the prompt (``Routed.prefill_lease``), released
at the first response byte (the prefill is over by then) or when the request ends, so load scorers in the
prefill profile see what picker already sent each prefill pod.

TTFT and TPOT are observed per endpoint only from streamed responses (SSE), where the first body bytes are the
first token: a non-streamed body arrives whole at the end, so its first byte says nothing about prefill. TPOT =
(end - first token) / (output tokens - 1), output tokens from the response's usage, else the number of SSE data
events (one per engine step, about a token each). An admitter that wants to know when capacity frees up
implements ``released()``; the director calls it after every lease release.

Nothing here knows protobuf or gRPC; the ext_proc stream calls these methods and turns results and
``PickerError``s into messages. Time comes from the injected clock.

Leases of requests whose gateway never reports the response (NGINX Gateway Fabric, Envoy with response
phases off) are *held* and released by ``expire`` after the request's expected duration (``expected_duration_s``:
a fixed allowance for queueing and prefill plus its expected output tokens at the endpoint's observed TPOT, or
``DEFAULT_TPOT_S``), at most ``inflight_timeout_s``. Holding every such lease for the whole timeout would count
minutes of finished requests as in-flight load, which saturates the token-load scorer of the default config.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from picker import errors
from picker.control import accounting
from picker.endpoints import hung
from picker.endpoints.inflight import InflightTracker, Lease
from picker.endpoints.model import Endpoint
from picker.endpoints.outliers import OutlierDetector
from picker.endpoints.store import EndpointStore
from picker.request import headers as hdr
from picker.request import rewrite, subset
from picker.request.model import InferenceRequest
from picker.scheduling.framework import UNCACHED_TOKENS, PluginTiming, ResponseInfo, SchedulingResult
from picker.settings import ServerSettings
from picker.telemetry import tracing

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

__all__ = [
    "DEFAULT_OUTPUT_TOKENS",
    "DEFAULT_TPOT_S",
    "HOLD_OVERHEAD_S",
    "MAX_EXPECTED_OUTPUT_TOKENS",
    "Admitter",
    "Director",
    "ReleaseListener",
    "Resolver",
    "Routed",
    "SchedulerLike",
    "TokenSource",
    "acquire_lease",
]

log = logging.getLogger(__name__)

NO_CANDIDATES = "failed to find endpoint candidates for serving the request"
NO_PODS = "no pods available in datastore"

# Expected output when a request names no max_tokens; max_tokens itself is an upper bound, so it is capped.
DEFAULT_OUTPUT_TOKENS = 256
MAX_EXPECTED_OUTPUT_TOKENS = 8192
HOLD_OVERHEAD_S = 2.0  # queueing + prefill allowance of a request whose end picker never sees
DEFAULT_TPOT_S = 0.05  # per output token, when the endpoint's TPOT was never observed


class SchedulerLike(Protocol):
    """What the director needs of ``scheduling.scheduler.Scheduler``."""

    def schedule(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> SchedulingResult: ...

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> Sequence[PluginTiming]: ...

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> Sequence[PluginTiming]: ...

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> Sequence[PluginTiming]: ...

    def response_headers(self, endpoint: Endpoint) -> Mapping[str, str]: ...

    def request_headers(self, req: InferenceRequest, result: SchedulingResult) -> Mapping[str, str]: ...


class Resolver(Protocol):
    """Seam for InferenceObjective priority and InferenceModelRewrite (the Kubernetes side fills it in).

    Returns the request with ``priority`` set and, unless ``req.target_model != req.model`` already (the
    rewrite header won), possibly rewritten via ``rewrite.rewrite_model``.
    """

    def __call__(self, req: InferenceRequest) -> InferenceRequest: ...


class Admitter(Protocol):
    """Seam for admission / flow control: return to admit, raise a ``PickerError`` to reject or shed.

    Async so a flow-control queue can hold the request; the candidates are those the scheduler will see.
    """

    async def admit(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> None: ...


class TokenSource(Protocol):
    """Seam for the prompt's token ids (``picker.kvevents.tokens``): looked up before scheduling, with a deadline
    of its own; None when they cannot be had (the scorers that need them fail open)."""

    async def token_ids(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> Sequence[int] | None: ...


@runtime_checkable
class ReleaseListener(Protocol):
    """Optional on an admitter: told after every in-flight lease release (capacity may have freed up)."""

    def released(self) -> None: ...


@dataclass(slots=True, eq=False)
class Routed:
    """A routed request: what the response path needs to account for it."""

    req: InferenceRequest
    result: SchedulingResult | None
    targets: tuple[Endpoint, ...]  # primary first
    destination: str  # "ip:port[,ip:port…]"
    lease: Lease | None
    received_at: float
    routed_at: float
    first_byte_at: float | None = None
    first_token_at: float | None = None  # streamed responses only (see the module docstring)
    finished: bool = field(default=False)
    headers: Mapping[str, str] = field(default_factory=dict)  # set on the upstream request by plugins
    prefill_lease: Lease | None = None  # on the prefiller named by x-prefiller-host-port
    watched: bool = False  # its first answer is awaited by hung-server detection (``Director.watch``)

    @property
    def endpoint_key(self) -> str:
        """The endpoint serving the request: the lease's, else the primary target's ("" with neither)."""
        if self.lease is not None:
            return self.lease.endpoint_key
        return self.targets[0].key if self.targets else ""


class Director:
    def __init__(
        self,
        *,
        store: EndpointStore,
        scheduler: SchedulerLike,
        inflight: InflightTracker,
        clock: Callable[[], float],
        settings: ServerSettings,
        resolver: Resolver | None = None,
        admitter: Admitter | None = None,
        rng: random.Random | None = None,
        tokens: TokenSource | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.inflight = inflight
        self.clock = clock
        self.settings = settings
        self.resolver = resolver
        self.admitter = admitter
        self.tokens = tokens
        self._on_release = admitter.released if isinstance(admitter, ReleaseListener) else None
        self._rng = rng or random.Random()
        self.tracer = tracer  # None: no tracing (telemetry/tracing.py)
        # Held leases: (deadline, seq, routed); seq breaks ties without comparing Routed.
        self._held: list[tuple[float, int, Routed]] = []
        self._seq = itertools.count()
        self.outliers = OutlierDetector()
        self.hung = hung.HungDetector()
        self._members_version = -1  # the snapshot whose members the per-endpoint series were last trimmed to

    # -- request path ------------------------------------------------------------------------------------

    def candidates(self, req: InferenceRequest) -> tuple[Endpoint, ...]:
        eps = self.store.current().candidates()
        if req.subset is not None and not self.settings.disable_subset_filter:
            eps = tuple(subset.filter_candidates(eps, req.subset))
        return eps

    async def route(self, req: InferenceRequest, *, received_at: float | None = None) -> Routed:
        """Choose the destination of a request whose body was parsed. Raises ``PickerError``."""
        if self.tracer is None:  # the hot path without tracing: no context managers at all
            return await self._route(req, received_at)
        with tracing.child(self.tracer, tracing.ORCHESTRATION_SPAN):
            return await self._route(req, received_at)

    async def _route(self, req: InferenceRequest, received_at: float | None) -> Routed:
        received = self.clock() if received_at is None else received_at
        target = req.headers.get(hdr.MODEL_REWRITE)
        if target and target != req.target_model:
            req = rewrite.rewrite_model(req, target)
        if self.resolver is not None:
            req = self.resolver(req)
        eps = self.candidates(req)
        if not eps:
            raise errors.ServiceUnavailable(NO_CANDIDATES)
        if self.admitter is not None:
            snapshot = self.store.current()
            if self.tracer is None:
                await self.admitter.admit(req, eps)
            else:
                with tracing.child(self.tracer, tracing.ADMISSION_SPAN, **{"picker.priority": req.priority}) as span:
                    began = self.clock()
                    await self.admitter.admit(req, eps)
                    if span is not None:
                        span.set_attribute("picker.admission.wait_ms", (self.clock() - began) * 1000.0)
            if self.store.current() is not snapshot:  # it waited in a queue: schedule on today's endpoints
                eps = self.candidates(req)
                if not eps:
                    raise errors.ServiceUnavailable(NO_CANDIDATES)
        if self.tokens is not None and req.token_ids is None:
            ids = await self.tokens.token_ids(req, eps)
            if ids is not None:
                req = dataclasses.replace(req, token_ids=ids)
        result = self._schedule(req, eps)
        return self._routed(req, result, result.targets, received)

    async def route_without_body(self, req: InferenceRequest, *, received_at: float | None = None) -> Routed:
        """Route a request whose body picker will not see (EOS on headers, or a headers-only body mode).

        The reference picks a random pod; picker runs the scheduler on what the headers tell (queue, KV and
        in-flight scorers still apply) and falls back to a random candidate if the filters leave none.
        """
        if self.tracer is None:
            return self._route_without_body(req, received_at)
        with tracing.child(self.tracer, tracing.ORCHESTRATION_SPAN, **{"picker.body": False}):
            return self._route_without_body(req, received_at)

    def _route_without_body(self, req: InferenceRequest, received_at: float | None) -> Routed:
        received = self.clock() if received_at is None else received_at
        if not self.store.current().endpoints:
            raise errors.Internal(NO_PODS)
        eps = self.candidates(req)
        if not eps:
            raise errors.ServiceUnavailable(NO_CANDIDATES)
        try:
            result: SchedulingResult | None = self._schedule(req, eps)
        except errors.ResourceExhausted:
            result = None
        targets = result.targets if result is not None else (self._rng.choice(eps),)
        return self._routed(req, result, targets, received)

    def _schedule(self, req: InferenceRequest, eps: Sequence[Endpoint]) -> SchedulingResult:
        if self.tracer is None:
            return self._run_scheduler(req, eps)
        with tracing.child(self.tracer, tracing.SCHEDULING_SPAN) as span:
            assert span is not None
            try:
                result = self._run_scheduler(req, eps)
            except errors.ResourceExhausted:
                _scheduling_attributes(span, eps, None)
                raise
            _scheduling_attributes(span, eps, result)
            return result

    def _run_scheduler(self, req: InferenceRequest, eps: Sequence[Endpoint]) -> SchedulingResult:
        try:
            result = self.scheduler.schedule(req, eps)
        except errors.ResourceExhausted:
            accounting.scheduling_failed(req)
            raise
        accounting.scheduled(req, result)
        return result

    def _routed(
        self, req: InferenceRequest, result: SchedulingResult | None, targets: tuple[Endpoint, ...], received: float
    ) -> Routed:
        if not targets:
            raise errors.ServiceUnavailable(NO_CANDIDATES)
        now = self.clock()
        lease = acquire_lease(self.inflight, targets[0].key, req, result, now)
        headers: Mapping[str, str] = {}
        prefill_lease = None
        if result is not None:
            headers = self.scheduler.request_headers(req, result)
            prefill_key = headers.get(hdr.PREFILLER)
            if prefill_key and prefill_key != targets[0].key:
                # The prefiller computes the prompt and one token; the decode lease keeps the rest.
                prefill_lease = self.inflight.acquire(prefill_key, req.prompt_tokens + 1, now)
        routed = Routed(
            req=req,
            result=result,
            targets=targets,
            destination=",".join(e.key for e in targets),
            lease=lease,
            received_at=received,
            routed_at=now,
            headers=headers,
            prefill_lease=prefill_lease,
        )
        accounting.routed(req)
        if result is not None:
            accounting.plugin_timings(self.scheduler.pre_request(req, result))
        return routed

    def record_error(self, err: errors.PickerError, req: InferenceRequest | None) -> None:
        accounting.failed(err, req)

    def watch(self, routed: Routed) -> None:
        """The gateway will report this request's response: await its first answer (hung-server detection).

        Only for such gateways: a request whose response picker never sees would look overdue forever.
        """
        if routed.finished or routed.watched or routed.lease is None:
            return
        req = routed.req
        nominal = hung.nominal_s(req.prompt_tokens, expected_output_tokens(req), whole_response=not req.stream)
        self.hung.watch(routed.lease.endpoint_key, routed, self.clock(), nominal)
        routed.watched = True

    # -- response path -----------------------------------------------------------------------------------

    def response_headers(self, routed: Routed, served_key: str | None = None) -> Mapping[str, str]:
        """Headers plugins set on the client's response (e.g. ``x-session-token``), for the endpoint that served
        the request: the gateway's served-endpoint metadata when it sent it, else the primary target."""
        endpoint = next((e for e in routed.targets if e.key == served_key), None) if served_key else None
        if endpoint is None:
            if not routed.targets:
                return {}
            endpoint = routed.targets[0]
        return self.scheduler.response_headers(endpoint)

    def answered(self, routed: Routed, status: int | None = None) -> None:
        """The server answered: a non-streamed response's headers, or any chunk of a response body.

        A 5xx may be the gateway's own (upstream timeout, reset): it ends the wait but is no sign of life.
        """
        key = routed.endpoint_key
        if not key:
            return
        alive = status is None or status < 500
        change = self.hung.answered(key, routed, self.clock(), alive=alive)
        if change is not None:
            self._apply_suspect([change])

    def first_byte(self, routed: Routed, *, token: bool = True) -> None:
        """The first response body bytes arrived: prefill is done.

        ``token``: they carry the first output token (a streamed response), so this is the TTFT.
        """
        if routed.first_byte_at is not None or routed.finished:
            return
        now = self.clock()
        routed.first_byte_at = now
        if token:
            routed.first_token_at = now
        if routed.prefill_lease is not None:
            self.inflight.release(routed.prefill_lease)
        if routed.lease is not None:
            self.inflight.prefilled(routed.lease, routed.req.prompt_tokens, now)
            if token:
                self.inflight.observe(routed.lease.endpoint_key, ttft_s=now - routed.routed_at)
        if token and (key := routed.endpoint_key):
            info = ResponseInfo(endpoint_key=key, ttft_s=now - routed.routed_at)
            accounting.plugin_timings(self.scheduler.first_token(routed.req, info))

    def complete(
        self,
        routed: Routed,
        *,
        status: int | None = None,
        response_bytes: int = 0,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        cached_tokens: int | None = None,
        served_key: str | None = None,
        stream_events: int | None = None,
    ) -> None:
        """The response finished (EOS or trailers): release, observe, run PostResponse plugins. Idempotent.

        ``stream_events``: SSE data events seen, the output-token estimate when the usage has none.
        """
        if routed.finished:
            return
        now = self.clock()
        first_token = routed.first_token_at
        ttft = first_token - routed.routed_at if first_token is not None else None
        duration = now - routed.received_at
        key = served_key or routed.endpoint_key
        output_tokens = completion_tokens or stream_events
        if first_token is not None and output_tokens and output_tokens > 1:
            self.inflight.observe(key, tpot_s=(now - first_token) / (output_tokens - 1))
        self._finish(routed)
        self._outlier(key, status, now)
        accounting.completed(
            routed.req,
            duration_s=duration,
            response_bytes=response_bytes,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
        )
        info = ResponseInfo(
            endpoint_key=key,
            status=status,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_tokens=cached_tokens,
            ttft_s=ttft,
            duration_s=duration,
        )
        self._post_response(routed, info)

    def abandon(self, routed: Routed) -> None:
        """The stream ended mid-response (client gone, proxy reset): release now."""
        if routed.finished:
            return
        self._finish(routed)
        info = ResponseInfo(endpoint_key=routed.endpoint_key, duration_s=self.clock() - routed.received_at)
        self._post_response(routed, info)

    def hold(self, routed: Routed) -> None:
        """No response phase will come: keep the lease for the request's expected duration (≤ the timeout)."""
        if routed.finished:
            return
        key = routed.endpoint_key
        hold_s = min(self.settings.inflight_timeout_s, expected_duration_s(routed.req, self.inflight.load(key).tpot_s))
        deadline = routed.routed_at + hold_s
        heapq.heappush(self._held, (deadline, next(self._seq), routed))

    def expire(self, now: float | None = None) -> int:
        """Release held leases whose deadline passed. Returns how many were released."""
        now = self.clock() if now is None else now
        released = 0
        while self._held and self._held[0][0] <= now:
            _, _, routed = heapq.heappop(self._held)
            if routed.finished:
                continue
            self._finish(routed)
            released += 1
            self._post_response(routed, ResponseInfo(endpoint_key=routed.endpoint_key))
        if released:
            accounting.expired(released)
        return released

    @property
    def held(self) -> int:
        return sum(1 for _, _, r in self._held if not r.finished)

    def check_hung(self, now: float | None = None) -> list[hung.Transition]:
        """Suspect the servers that stopped answering, readmit the long-suspect on probation."""
        now = self.clock() if now is None else now
        changes = self.hung.check(now, (e.key for e in self.store.current()))
        if changes:
            self._apply_suspect(changes)
        return changes

    async def run_hung_check(self, *, interval_s: float = 0.05) -> None:
        """Background task: ``check_hung`` every ``interval_s`` until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.check_hung()

    def _apply_suspect(self, changes: Sequence[hung.Transition]) -> None:
        for change in changes:
            if change.suspect:
                log.warning(
                    "endpoint %s suspected hung, left out of scheduling: %s",
                    change.key,
                    change.detail,
                    extra={"endpoint": change.key},
                )
            else:
                log.info(
                    "endpoint %s no longer suspected hung: %s",
                    change.key,
                    change.detail,
                    extra={"endpoint": change.key},
                )
            accounting.suspect(change.key, change.suspect)
        self.store.set_suspect({c.key: c.suspect for c in changes})

    async def run_expiry(self, *, interval_s: float = 1.0) -> None:
        """Background task: sweep held leases and end outlier ejections until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            self.expire()
            self.readmit_outliers()
            self.forget_departed()

    def forget_departed(self) -> int:
        """Drop the metric series of endpoints that left the pool (once per membership change)."""
        snap = self.store.current()
        if snap.version == self._members_version:
            return 0
        self._members_version = snap.version
        return accounting.forget_endpoints({e.key for e in snap}, {e.name for e in snap})

    def _outlier(self, key: str, status: int | None, now: float) -> None:
        snap = self.store.current()
        if snap.get(key) is None or not self.outliers.record(key, status, now, len(snap)):
            return
        log.warning(
            "endpoint %s ejected from scheduling: %d consecutive 5xx responses",
            key,
            self.outliers.settings.consecutive_5xx,
            extra={"endpoint": key, "status": status},
        )
        accounting.ejected(key)
        self.store.set_ejected({key: True})

    def readmit_outliers(self, now: float | None = None) -> list[str]:
        """End the ejections that are over (and forget endpoints that left the pool)."""
        snap = self.store.current()
        self.outliers.forget_except(e.key for e in snap)
        due = self.outliers.readmit_due(self.clock() if now is None else now)
        if due:
            log.info("endpoints readmitted after ejection: %s", ", ".join(due), extra={"endpoints": due})
            self.store.set_ejected(dict.fromkeys(due, False))
        return due

    def _finish(self, routed: Routed) -> None:
        routed.finished = True
        if routed.watched and routed.lease is not None:
            self.hung.done(routed.lease.endpoint_key, routed)
        if routed.lease is not None:
            self.inflight.release(routed.lease)
        if routed.prefill_lease is not None:
            self.inflight.release(routed.prefill_lease)
        accounting.released(routed.req)
        if self._on_release is not None:
            self._on_release()

    def _post_response(self, routed: Routed, info: ResponseInfo) -> None:
        try:
            accounting.plugin_timings(self.scheduler.post_response(routed.req, info))
        except Exception:  # a plugin bug must not break the response path
            log.exception("post_response plugin failed", extra={"request_id": routed.req.request_id})


_MAX_LISTED_CANDIDATES = 64  # a span lists at most this many candidate endpoints (the count is always there)


def _scheduling_attributes(span: Span, eps: Sequence[Endpoint], result: SchedulingResult | None) -> None:
    """A scheduling cycle on its span: candidates, the chosen endpoint(s), each plugin's scores per profile."""
    if not span.is_recording():
        return
    span.set_attribute("picker.candidates.count", len(eps))
    span.set_attribute("picker.candidates", [e.key for e in eps[:_MAX_LISTED_CANDIDATES]])
    if result is None:
        return
    span.set_attribute("picker.endpoint", result.targets[0].key if result.targets else "")
    span.set_attribute("picker.targets", [e.key for e in result.targets])
    span.set_attribute("picker.profile", result.primary_profile)
    span.set_attribute("picker.scheduling.duration_ms", result.duration_s * 1000.0)
    span.set_attribute("picker.scores", tracing.json_attribute(result.explain()["profiles"]))


def expected_output_tokens(req: InferenceRequest) -> int:
    out = req.max_tokens if req.max_tokens is not None and req.max_tokens > 0 else DEFAULT_OUTPUT_TOKENS
    return min(out, MAX_EXPECTED_OUTPUT_TOKENS)


def expected_duration_s(req: InferenceRequest, tpot_s: float | None) -> float:
    """How long a request whose end picker will not see is assumed to run: an allowance plus its output time."""
    per_token = tpot_s if tpot_s is not None and tpot_s > 0.0 else DEFAULT_TPOT_S
    return HOLD_OVERHEAD_S + expected_output_tokens(req) * per_token


def acquire_lease(
    inflight: InflightTracker, key: str, req: InferenceRequest, result: SchedulingResult | None, now: float
) -> Lease:
    """Count ``req`` routed to ``key`` in picker's ledger, with what the server model reads of it: the prompt
    tokens left to compute there (``UNCACHED_TOKENS`` of the scheduling cycle, else the whole prompt), its
    ``max_tokens`` and whether the answer is fixed at that length."""
    prefill = req.prompt_tokens
    if result is not None and result.cycle is not None:
        uncached = result.cycle.get(UNCACHED_TOKENS)
        if uncached is not None and key in uncached:
            prefill = round(uncached[key])
    return inflight.acquire(
        key,
        expected_tokens(req),
        now,
        prefill_tokens=prefill,
        max_output_tokens=req.max_tokens or 0,
        fixed_output=req.fixed_output,
        model=req.target_model,
    )


def expected_tokens(req: InferenceRequest) -> int:
    """Tokens a request will occupy on its endpoint: its prompt plus the output it expects."""
    return req.prompt_tokens + expected_output_tokens(req)
