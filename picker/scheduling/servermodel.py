"""The server model: what a request would wait and cost on each model server, in seconds.

A model server (vLLM, SGLang, ...) runs at most ``capacity`` sequences at once (``max_num_seqs``, or fewer when
its KV cache is full); the rest wait, first come first served. A request's time to first token on server ``e``:

    ttft_e = slot_wait_e + prefill_base + (prefill_ahead_e + uncached_e) * s_per_token * speed_e + step_e

* ``slot_wait_e``: 0 while a slot is free and the request's KV fits. Else the time until it can start: the
  running requests' remaining answers (picker's own request by request: tokens left = expected answer - time
  since its first token / step; others' spread evenly over the mean answer), then each request queued ahead
  taking the next free slot for its whole answer; a request starts only when its prompt's KV fits beside what
  the running ones hold (``num_gpu_blocks`` x block size in all), as vLLM admits.
* ``prefill_ahead_e``: the prompt tokens still to compute there before this one's (others' waiting requests at
  the mean prompt; picker's own as routed, less what the server computed since the oldest arrived, first come
  first served).
* ``uncached_e``: this prompt's tokens that server does not cache (the prefix index, when one is bound).
* a LoRA adapter not loaded where every adapter slot is taken (by what the server reported and what picker
  routed there since) waits for one to drain: about a whole answer (the running adapter drains with its last
  request).
* ``step_e``: the server's engine step, i.e. its time per output token, with this request in its batch:
  ``speed_e * (a + c * (batch_e + 1))``. A decode step reads the weights once and each sequence's KV: its time
  grows with the batch. ``a`` and ``c`` are fitted over the pool to picker's observed TPOTs against the batch each
  request ran in; ``speed_e`` is how much slower than that fit the server has been (a throttled or shared GPU): from
  picker's answers there, and from its work counters between reports (over a second or more while it runs anything
  and does not queue on a full KV cache, the time that passed over what the tokens it generated and the prompt
  tokens it computed take at the pool's pace: every busy server shows its pace, whoever sent its work); or, where
  the counters do not show it (none, stopped since, queueing on a full KV cache, or not yet read over a window: then
  against a second at least), how many times its predicted TTFT picker's oldest request awaiting a first token there
  has waited, over the pool's usual lateness, if more (a stalled server shows before any answer ends); a belief
  that drifts back to the pool's pace by half every few seconds without news. A slow server is slow at prefill too.
  At least one step emits the first token.

Slots are learned from what each server reports: the most requests it was seen running, counted as its limit once
it was seen there with a queue and KV room to spare in several reports between which one of picker's requests
there finished (a queue that persists while slots free and fill again; one long prefill step shows the same
report many times and proves nothing; requests waiting for a LoRA adapter that is not loaded wait for an adapter
slot, not a sequence slot). A server without a known limit takes the pool's median of the known ones;
none known: no slot limit. ``s_per_token`` and ``prefill_base`` are a resistant line through picker's own first
tokens (the part of each TTFT beyond the predicted fixed part, against the tokens computed, per unit of that
server's speed), from the requests whose own prompt was most of what was computed before their first token
(prompts computed in the same step end together); before any, ``DEFAULT_S_PER_TOKEN``. The mean answer per model
is learned from completions; picker's routing rate, and each server's share of it, from its own decisions.

What going to ``e`` costs the others, ``next_delay_e``: a typical request arriving right after this one waits for
this one's prefill, and for a slot or KV room while this one holds it. The requests arriving at ``e`` while this one
waits (``rate_e`` x ``ttft_e``: picker's recent rate there, times all requests in flight over picker's own, which by
Little's law counts the arrivals of other replicas and clients) are all delayed so (the marginal cost of work added
to a queue). Where the server is full (a request arriving next would wait), this one also holds its share of it,
``held_e`` (one slot of ``capacity``, or its prompt and answer of the KV cache, the larger), for its whole run
``run_e`` (its prefill and answer): each request arriving while it is there starts ``run_e * held_e`` later. The
scorer's cost is ``ttft_e + (answer - 1) * step_e + next_delay_e * (1 + rate_e * ttft_e) + hold_e`` with ``hold_e =
rate_e * (ttft_e + run_e) * run_e * held_e``: the request's own end-to-end time (for a short answer its TTFT, for a
long one mostly its TPOT) plus its delay to the requests behind it. Under load that keeps a prompt where it is
cached (computing it elsewhere delays everyone queued behind it there), and a long answer away from a full server
many requests go to: a slot a long answer holds for seconds is one the short ones there would have had.

Traffic picker did not route (other replicas, clients that bypass picker) enters through the servers' reported
counts (``PluginContext.server_load``): as work ahead, and as arrivals behind.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from picker.endpoints.inflight import Lease
from picker.endpoints.model import Endpoint, EndpointMetrics
from picker.plugins.api import PluginContext

__all__ = [
    "DEFAULT_ANSWER_TOKENS",
    "DEFAULT_STEP_S",
    "DEFAULT_S_PER_TOKEN",
    "Demand",
    "Estimate",
    "ServerModel",
    "StepFit",
    "answer_tokens",
    "resistant_line",
    "start_wait_s",
    "start_waits_s",
]

DEFAULT_STEP_S = 0.02  # an engine step before any TPOT is observed
DEFAULT_S_PER_TOKEN = 1e-4  # prefill seconds per prompt token before any first token is observed
DEFAULT_ANSWER_TOKENS = 256.0  # a model's mean answer before any completion is seen
_ALPHA = 0.05  # moving averages over about the last 20 observations
_MIN_PREFILL_TOKENS = 8  # a first token teaches the prefill rate only when it had this many tokens to compute
_PREFILL_SAMPLES = 64  # the prefill rate is fitted to this many recent first tokens
_PINNED = 3  # reports at the same most-running count with a queue that make it the server's slot limit
_KV_BOUND = 0.9  # a server queueing with its KV cache this full is bound by KV, not by its sequence slots
_NO_LIMIT = 1 << 30  # slots of a server whose limit was never seen
_FIT_ALPHA = 0.02  # the step-time fit: exponentially weighted over about the last 50 completions
# A sequence more in a batch adds at least this share of the step's fixed part (each decode step reads every
# sequence's KV): before the fit can tell a slope, a server with more requests in flight is never the cheaper one.
_MIN_SLOPE_SHARE = 0.001
_RATE_WINDOW_S = 1.0  # picker's routing rate is counted over this much of the recent past
_MAX_SPEED = 5.0  # a server's speed factor stays within [1/5, 5] of the pool's fit
# A server not observed lately drifts back to the pool's pace by half every this many seconds: it gets requests
# again, and they tell whether it is still slow (a server that recovered is otherwise never tried again)
_SPEED_HALF_LIFE_S = 5.0
_SPEED_NOISE = 1.5  # relative speeds within [1/1.5, 1.5] of the pool's median count as the pool's
_SPEED_GAIN = 0.08  # how far one completion moves a server's speed towards what it showed
_WORK_WINDOW_S = 1.0  # a server's work counters are read over windows of at least this long


@dataclass(slots=True)  # not frozen: one is built per candidate per decision, and a frozen one costs 5x to build
class Estimate:
    """One candidate's prediction for one request (read only once made)."""

    ttft_s: float
    tpot_s: float
    fixed_s: float  # the part of ttft_s outside the prefill line (the wait for a slot, the step, a LoRA load)
    prefill_tokens: float  # the tokens computed before this request's first token (ahead of it and its own)
    speed: float  # how much slower than the pool's fit the server has been
    slot_wait_s: float = 0.0  # the part of ttft_s spent waiting for a sequence slot
    batch: float = 0.0  # the requests the server runs, as estimated
    # How much longer a typical request arriving next would wait there because this one went first: this one's
    # prefill ahead of it, and the wait for a slot (or KV room) if this one takes the last.
    next_delay_s: float = 0.0
    own_tokens: float = 0.0  # this request's uncached prompt tokens there
    # Requests per second arriving at the server lately, everyone's: picker's routing there times all requests in
    # flight at the candidates over picker's own (by Little's law, the arrivals of other replicas and clients)
    arrivals_per_s: float = 0.0
    # Seconds lost by the requests arriving there while this one is on a full server: it holds its share of the
    # server (a slot, or its KV) for its whole run, and each of them starts that much later (0 where a request
    # arriving next would start at once)
    hold_s: float = 0.0

    def e2e_s(self, answer_tokens: float) -> float:
        return self.ttft_s + max(0.0, answer_tokens - 1.0) * self.tpot_s

    def cost_s(self, answer_tokens: float) -> float:
        """Seconds of the pool's requests that going there costs: this one's end-to-end time, its delay to each
        request arriving there while it waits, and the share of a full server it holds while it runs."""
        return self.e2e_s(answer_tokens) + self.next_delay_s * (1.0 + self.arrivals_per_s * self.ttft_s) + self.hold_s


def answer_tokens(max_tokens: int, fixed: bool, mean: float) -> float:
    """Expected answer length: exact when fixed, else the model's recent mean, capped by ``max_tokens``."""
    if fixed and max_tokens > 0:
        return float(max_tokens)
    return min(mean, float(max_tokens)) if max_tokens > 0 else mean


class Demand(NamedTuple):
    """A request on a server: seconds it runs (left), and the KV tokens it holds (running) or needs to start."""

    seconds: float
    kv_tokens: float


def start_wait_s(
    running: Sequence[Demand], queued: Sequence[Demand], ours: Demand, slots: int, kv_tokens: float
) -> float:
    """Seconds until a request needing ``ours.kv_tokens`` starts on a server with ``slots`` sequence slots and
    ``kv_tokens`` of KV cache, running ``running`` (seconds left, KV held now), with ``queued`` ahead of it first
    come first served: each starts when a slot is free and its prompt's KV fits beside what runs (as vLLM admits),
    and holds both until it ends."""
    return start_waits_s(running, (*queued, ours), slots, kv_tokens)[-1]


def start_waits_s(running: Sequence[Demand], queue: Sequence[Demand], slots: int, kv_tokens: float) -> list[float]:
    """``start_wait_s`` of each request of ``queue`` in turn (first come first served)."""
    used = 0.0
    for r in running:
        used += r.kv_tokens
    heap: list[tuple[float, float]] | None = None
    t = 0.0
    out: list[float] = []
    for item in queue:
        if heap is None:
            if len(running) < slots and used + item.kv_tokens <= kv_tokens:
                out.append(0.0)  # starts at once: only now does it need a place beside the running ones
                running = [*running, item]
                used += item.kv_tokens
                continue
            heap = [(r.seconds, r.kv_tokens) for r in running]
            heapq.heapify(heap)
        while heap and (len(heap) >= slots or used + item.kv_tokens > kv_tokens):
            end, freed = heapq.heappop(heap)
            t = max(t, end)
            used -= freed
        out.append(t)
        heapq.heappush(heap, (t + item.seconds, item.kv_tokens))
        used += item.kv_tokens
    return out


class _WorkCounters(NamedTuple):
    """A server's work counters as one report gave them (the start of a window of reports)."""

    generated: float
    queried: float
    hits: float
    running: int
    at: float


def _others_kv(mean_prompt: float, mean_answer: float, left: float) -> float:
    """The KV tokens a request picker did not route holds with ``left`` of its answer still to come (its prompt at
    the mean, and the part of the mean answer it has streamed)."""
    return mean_prompt + mean_answer * (1.0 - left)


def _adapter_wait(
    endpoint: Endpoint, adapter: str, answer_s: float, leases: Collection[Lease], adapters: Collection[str]
) -> float:
    """A LoRA adapter that is not running where every adapter slot is taken waits until one drains: the server
    keeps admitting the running adapter's requests, so it frees its slot only when the last of them ends, about a
    whole answer. Running, or with a slot free (loading takes about a step), nothing more. An adapter that is only
    waiting there is not loaded: it waits like any other. The adapters taken: those the server reported running or
    waiting, and those of picker's requests there (``leases``) whose model is a known adapter (``adapters``). A
    server that reports no adapter slots (``max_loras`` 0) serves base models only as far as picker knows: nothing."""
    m = endpoint.metrics
    if m.max_loras <= 0 or adapter in m.running_loras:
        return 0.0
    routed = {lease.model for lease in leases if lease.model in adapters}
    taken = m.running_loras | m.waiting_loras | frozenset(routed)
    if len(taken) < m.max_loras or (adapter in routed and adapter not in m.waiting_loras):
        return 0.0
    return answer_s


def resistant_line(points: Collection[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept >= 0) of Tukey's resistant line through ``points`` (x > 0): the slope between the medians
    of the lowest and the highest third by x, so that a few first tokens delayed by a queue move it little. With x
    too alike to tell a slope (or a slope <= 0): the median of y / x through the origin."""
    ordered = sorted(points)
    n = len(ordered)
    third = n // 3
    if third >= 2:
        low, high = ordered[:third], ordered[n - third :]
        x_low, x_high = statistics.median(p[0] for p in low), statistics.median(p[0] for p in high)
        if x_high > 1.5 * x_low:
            slope = (statistics.median(p[1] for p in high) - statistics.median(p[1] for p in low)) / (x_high - x_low)
            if slope > 0.0:
                return slope, max(0.0, statistics.median(y - slope * x for x, y in ordered))
    return statistics.median(y / x for x, y in ordered), 0.0


class StepFit:
    """Step time against batch size, ``a + c * batch``, fitted by exponentially weighted least squares."""

    __slots__ = ("_b", "_bb", "_bt", "_n", "_t")

    def __init__(self) -> None:
        self._n = 0
        self._b = self._t = self._bb = self._bt = 0.0

    def add(self, batch: float, step_s: float) -> None:
        if self._n == 0:
            self._b, self._t, self._bb, self._bt = batch, step_s, batch * batch, batch * step_s
        else:
            k = _FIT_ALPHA
            self._b += k * (batch - self._b)
            self._t += k * (step_s - self._t)
            self._bb += k * (batch * batch - self._bb)
            self._bt += k * (batch * step_s - self._bt)
        self._n += 1

    def coefficients(self) -> tuple[float, float]:
        """(a, c); ``(DEFAULT_STEP_S, ...)`` before any observation; ``c`` at least ``_MIN_SLOPE_SHARE`` of ``a``,
        which it is while the batches seen hardly vary."""
        if self._n == 0:
            return DEFAULT_STEP_S, DEFAULT_STEP_S * _MIN_SLOPE_SHARE
        var = self._bb - self._b * self._b
        if var < 0.25:
            return self._t, self._t * _MIN_SLOPE_SHARE
        c = max(0.0, (self._bt - self._b * self._t) / var)
        a = self._t - c * self._b
        if a <= 0.0:  # a fit through zero: the step is all per-sequence work
            return 1e-4, self._bt / self._bb if self._bb > 0.0 else 0.0
        return a, max(c, a * _MIN_SLOPE_SHARE)


class ServerModel:
    """The learned part of the model (capacities, step times, prefill rate, answer lengths) and the estimate."""

    __slots__ = (
        "_adapters",
        "_answers",
        "_arrivals",
        "_batch",
        "_ctx",
        "_done",
        "_done_at_pin",
        "_first_due",
        "_fit",
        "_most_running",
        "_moved",
        "_paced",
        "_pinned",
        "_prefill_samples",
        "_prompt_tokens",
        "_seen",
        "_share",
        "_speed",
        "_speed_at",
        "_work_seen",
        "prefill_base_s",
        "s_per_token",
    )

    def __init__(self, ctx: PluginContext) -> None:
        self._ctx = ctx
        self._adapters: set[str] = set()  # names servers reported as LoRA adapters (running or waiting)
        self._most_running: dict[str, int] = {}  # the most requests each server was seen running
        # Reports of each server at its most running with requests waiting and KV to spare (reset when it runs more)
        self._pinned: dict[str, int] = {}
        self._done: dict[str, int] = {}  # picker's requests seen to finish on each server
        self._done_at_pin: dict[str, int] = {}  # ... as of the last report that counted towards its slot limit
        self._seen: dict[str, float] = {}  # the last report read of each server (its updated_at)
        self._work_seen: dict[str, _WorkCounters] = {}  # each server's counters at the start of its window
        self._batch: dict[str, float] = {}  # the requests each server ran when last estimated
        self._speed: dict[str, float] = {}  # observed step / the fit's, per server
        self._speed_at: dict[str, float] = {}  # when each server's speed was last observed
        # picker's requests awaiting their first token on each server, oldest first: request id -> (routed at,
        # predicted TTFT). A first token long overdue shows a slow server before any answer ends there.
        self._first_due: dict[str, OrderedDict[str, tuple[float, float]]] = {}
        # Each server's generated-tokens counter and the report in which it last moved while its pace could be read
        # (running, not queueing on a full KV cache): a first token is overdue only where this is older than it.
        self._moved: dict[str, tuple[float, float]] = {}
        self._paced: set[str] = set()  # servers with a window of work counters read: their pace is the counters'

        self._fit = StepFit()
        self._answers: dict[str, float] = {}  # model -> mean answer tokens
        self._prompt_tokens = 0.0  # mean prompt tokens computed (for requests known only as a count); 0: none yet
        self._arrivals: deque[float] = deque()  # when picker routed each request of the last _RATE_WINDOW_S
        self._share: dict[str, float] = {}  # the share of picker's requests routed to each server, lately
        self._prefill_samples: deque[tuple[float, float]] = deque(maxlen=_PREFILL_SAMPLES)
        self.s_per_token = DEFAULT_S_PER_TOKEN
        self.prefill_base_s = 0.0

    def now(self) -> float:
        return self._ctx.clock()

    # -- learning ---------------------------------------------------------------------------------------------
    def observe_reports(self, endpoints: Sequence[Endpoint]) -> None:
        """Learn slot capacities from fresh reports: a server runs at least as many requests as it was ever seen
        running, and that is its limit once it was seen ``_PINNED`` times at it with requests waiting and KV room
        to spare. A queue at a running count that keeps rising is prefill work waiting for its step (the token
        budget), not a slot limit; a full KV cache bounds the batch below the slots (the estimate counts KV apart)."""
        now = self._ctx.clock()
        max_age = self._ctx.metrics_max_age_s
        most, pinned = self._most_running, self._pinned
        for e in endpoints:
            m = e.metrics
            if m.updated_at == self._seen.get(e.key) or now - m.updated_at > max_age:
                continue  # a report counts once
            key = e.key
            self._seen[key] = m.updated_at
            self._observe_work(key, m)
            if m.running_loras or m.waiting_loras:
                self._adapters.update(m.running_loras, m.waiting_loras)
            if m.running > most.get(key, 0):
                most[key] = m.running
                pinned[key] = 0
            # (none running while some wait is no slot limit: an adapter that cannot load, a server starting; nor
            # is a queue of requests for an adapter not loaded: they wait for an adapter slot, not a sequence slot)
            if m.waiting_loras and not m.waiting_loras <= m.running_loras:
                continue
            if m.waiting > 0 and 0 < m.running == most.get(key, 0) and m.kv_usage < _KV_BOUND:
                done = self._done.get(key, 0)
                if done > self._done_at_pin.get(key, -1):
                    self._done_at_pin[key] = done
                    pinned[key] = pinned.get(key, 0) + 1

    def _observe_work(self, key: str, m: EndpointMetrics) -> None:
        """A server's speed as its work counters show it over a window of reports: the time that passed over what
        its work takes at the pool's pace (its steps, the tokens it generated over the sequences it ran, at the
        fitted step; the prompt tokens it computed, those it looked up in its prefix cache as it admitted them less
        those it found there, at the fitted prefill rate). Every server that runs anything shows its pace, whoever
        sent its work, not only when one of picker's requests there ends (a slow server gets few of them to end).
        A window lasts a second at least: a prompt is counted as it is admitted and computed over the next steps."""
        if m.generated_tokens is None:
            return
        if m.running == 0 or (m.waiting > 0 and m.kv_usage >= _KV_BOUND):
            # Idle: the next window starts when it runs again (idle time is no work). Queueing on a full KV cache:
            # vLLM looks a waiting request up again at every step until it fits and counts every lookup, so the
            # prompt counters overstate the work; a window with such a report is not read.
            self._work_seen.pop(key, None)
            self._moved.pop(key, None)
            return
        moved = self._moved.get(key)
        if moved is None or m.generated_tokens != moved[0]:
            self._moved[key] = (m.generated_tokens, m.updated_at)
        now = _WorkCounters(
            m.generated_tokens, m.prefix_query_tokens or 0.0, m.prefix_hit_tokens or 0.0, m.running, m.updated_at
        )
        last = self._work_seen.get(key)
        if last is None or now.generated < last.generated or now.queried < last.queried or now.hits < last.hits:
            self._work_seen[key] = now  # a new window (a counter that went back: the server restarted)
            return
        generated, elapsed = now.generated - last.generated, now.at - last.at
        if elapsed < _WORK_WINDOW_S or generated <= 0.0:
            return  # too short a window: a prompt's prefill and its count fall into different reports
        self._work_seen[key] = now
        batch = 0.5 * (now.running + last.running)
        a, c = self._fit.coefficients()
        computed = max(0.0, (now.queried - last.queried) - (now.hits - last.hits))
        expected = generated / batch * (a + c * batch) + computed * self.s_per_token
        self._observe_speed(key, elapsed / expected, 1.0 - 0.5 ** (elapsed / _SPEED_HALF_LIFE_S))
        self._paced.add(key)

    def observe_done(self, key: str) -> None:
        """One of picker's requests finished on ``key``: a slot freed there."""
        self._done[key] = self._done.get(key, 0) + 1

    def capacity(self, key: str, pool: int | None = None) -> int:
        """A server's slots: the most it ran, once it was seen queueing; for one never seen queueing, the pool's
        median of the known ones (``pool``: as ``pool_capacity()`` returned), if above what it ran; 0: unknown (no
        limit)."""
        most = self._most_running.get(key, 0)
        if self._pinned.get(key, 0) >= _PINNED:
            return most
        if pool is None:
            pool = self.pool_capacity()
        return max(most, pool) if pool else 0

    def pool_capacity(self) -> int:
        """The median of the slot limits known in the pool (0: none known)."""
        most = self._most_running
        known = [most.get(k, 0) for k, n in self._pinned.items() if n >= _PINNED]
        return int(statistics.median(known)) if known else 0

    def batch(self, key: str) -> float:
        """The requests ``key`` ran when it was last estimated (0: never)."""
        return self._batch.get(key, 0.0)

    def speeds(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """How much slower than the pool each server is: its step against the fit (as believed now,
        ``_speed_now``) over the candidates' median, or if more how overdue its oldest awaited first token is
        over the candidates' usual lateness (under load every first token is late alike, which says nothing); 1
        within the band of noise (``_SPEED_NOISE``: a step swings with the prefill mixed into it, and following
        that swing sends work to whichever server was lightest a moment ago)."""
        now = self._ctx.clock()
        speed_now, overdue, due = self._speed_now, self._overdue, self._first_due
        raw = [speed_now(e.key, now) for e in endpoints]
        late = [overdue(e.key, now) if e.key in due else 0.0 for e in endpoints]
        if not any(late) and all(r == 1.0 for r in raw):
            return raw  # nothing learned against any of them (the common case before the first answers)
        median = statistics.median(raw) if raw else 1.0
        # Late first tokens count against the pool's own lateness: under load every server's are late alike
        usual = max(1.0, statistics.median(max(1.0, x) for x in late)) if late else 1.0
        out = []
        for r, x in zip(raw, late, strict=True):
            f = max(r / median if median > 0.0 else 1.0, x / usual)
            out.append(1.0 if 1.0 / _SPEED_NOISE <= f <= _SPEED_NOISE else f)
        return out

    def _speed_now(self, key: str, now: float) -> float:
        """A server's speed factor as believed at ``now``: what it showed, drifting back to the pool's pace by half
        every ``_SPEED_HALF_LIFE_S`` since (a server not observed lately gets requests again, and they tell whether
        it is still slow; a server that recovered is otherwise never tried again)."""
        speed = self._speed.get(key, 1.0)
        at = self._speed_at.get(key)
        if at is None or speed == 1.0:
            return speed
        kept: float = 0.5 ** (max(0.0, now - at) / _SPEED_HALF_LIFE_S)
        return 1.0 + (speed - 1.0) * kept

    def _overdue(self, key: str, now: float) -> float:
        """How many times its predicted TTFT the oldest of picker's requests still awaiting a first token on
        ``key`` has waited (0 when none awaits one). Not where the server's work counters show its pace: they
        moved since that request was routed, in a report that can be read, and a window of them was read. A late
        first token is a stall's sign (a server that reports nothing, or no progress); where the pace is known it
        says little, since a short prediction misses by many times itself (a cached prompt behind another's
        prefill). A server whose counters move but whose first window is still open (its first second of work)
        is judged against a second at least: a prediction's miss by many times itself is not slowness, a first
        token a second overdue is."""
        due = self._first_due.get(key)
        if not due:
            return 0.0
        if self._ctx.inflight.load(key).prefilling == 0:
            due.clear()  # those requests ended without a word to this model (a reset stream, an error)
            return 0.0
        routed, predicted = next(iter(due.values()))
        moved = self._moved.get(key)
        if moved is not None and moved[1] > routed:
            if key in self._paced:
                return 0.0
            predicted = max(predicted, _WORK_WINDOW_S)
        return min(_MAX_SPEED, (now - routed) / predicted) if predicted > 0.0 else 0.0

    def expect_first_token(self, key: str, request_id: str, now: float, ttft_s: float) -> None:
        """One of picker's requests was routed to ``key`` at ``now``, its first token predicted in ``ttft_s``."""
        self._first_due.setdefault(key, OrderedDict())[request_id] = (now, ttft_s)

    def first_token_seen(self, key: str, request_id: str) -> None:
        """The request's first token came (or it ended without one)."""
        due = self._first_due.get(key)
        if due is not None:
            due.pop(request_id, None)

    def observe_step(self, key: str, batch: float, step_s: float) -> None:
        """Learn from one completed request's TPOT on ``key``, which ran in a batch of about ``batch`` requests."""
        a, c = self._fit.coefficients()
        predicted = a + c * batch
        if predicted > 0.0:
            self._observe_speed(key, step_s / predicted, _SPEED_GAIN)
        self._fit.add(batch, step_s)

    def _observe_speed(self, key: str, ratio: float, gain: float) -> None:
        """Move ``key``'s speed by ``gain`` of the way to ``ratio`` (its time over the pool's for the same work)."""
        now = self._ctx.clock()
        speed = self._speed_now(key, now)
        ratio = min(_MAX_SPEED, max(1.0 / _MAX_SPEED, ratio))
        self._speed[key] = speed + gain * (ratio - speed)
        self._speed_at[key] = now

    def observe_answer(self, model: str, tokens: int) -> None:
        mean = self._answers.get(model)
        self._answers[model] = float(tokens) if mean is None else mean + _ALPHA * (tokens - mean)

    def mean_answer(self, model: str) -> float:
        return self._answers.get(model, DEFAULT_ANSWER_TOKENS)

    def observe_arrival(self, now: float, key: str) -> None:
        """A request was routed to ``key`` at ``now``: the pool's arrival rate and each server's share follow."""
        share = self._share
        for k in share:
            share[k] *= 1.0 - _ALPHA
        share[key] = share.get(key, 0.0) + _ALPHA
        self._arrivals.append(now)
        self._drop_arrivals(now)

    def _drop_arrivals(self, now: float) -> None:
        arrivals = self._arrivals
        while arrivals and arrivals[0] <= now - _RATE_WINDOW_S:
            arrivals.popleft()

    @property
    def arrivals_per_s(self) -> float:
        """Requests picker routed per second over the last ``_RATE_WINDOW_S`` (a burst of a few requests a
        millisecond apart is a few requests, not a thousand a second)."""
        self._drop_arrivals(self._ctx.clock())
        return len(self._arrivals) / _RATE_WINDOW_S

    def arrivals_at(self, key: str) -> float:
        """Requests per second picker routed to ``key``, lately (``Estimate.arrivals_per_s`` adds everyone
        else's)."""
        return self.arrivals_per_s * self._share.get(key, 0.0)

    def observe_prompt(self, tokens: float) -> None:
        mean = self._prompt_tokens
        self._prompt_tokens = tokens if mean <= 0.0 else mean + _ALPHA * (tokens - mean)

    def observe_first_token(self, ttft_s: float, predicted: Estimate) -> None:
        """Learn the prefill rate from one observed TTFT against what was predicted for it: only requests predicted
        to get a slot at once (a slot wait mispredicted is no prefill time) whose own prompt was most of what the
        server computed before their first token (prompts computed together in one step end together, so tokens
        ahead say little about when a first token comes)."""
        tokens = predicted.prefill_tokens
        rest = predicted.fixed_s  # the wait, the step, a LoRA load
        if tokens < _MIN_PREFILL_TOKENS or predicted.slot_wait_s > 0.0 or rest > ttft_s:
            return
        if predicted.own_tokens * 2.0 < tokens:
            return
        # The line is fitted to what the prefill took beyond the rest of the prediction, per unit of the server's
        # speed: its intercept is the base itself, not a correction of the base the prediction used.
        speed = predicted.speed or 1.0
        samples = self._prefill_samples
        samples.append((tokens, (ttft_s - rest) / speed))
        self.s_per_token, self.prefill_base_s = resistant_line(samples)

    def forget(self, keys: Collection[str]) -> None:
        """Drop what was learned of servers that left the pool."""
        for table in (
            self._most_running,
            self._pinned,
            self._seen,
            self._work_seen,
            self._batch,
            self._speed,
            self._speed_at,
            self._first_due,
            self._moved,
            self._share,
            self._done,
            self._done_at_pin,
        ):
            for key in [k for k in table if k not in keys]:
                del table[key]
        self._paced.intersection_update(keys)

    # -- estimating -------------------------------------------------------------------------------------------
    def estimate(
        self, model: str, answer: float, uncached: Sequence[float], endpoints: Sequence[Endpoint]
    ) -> list[Estimate]:
        """Each candidate's estimate for a request of ``model`` (a base model or LoRA adapter) expecting ``answer``
        tokens, with ``uncached`` prompt tokens per candidate."""
        ctx = self._ctx
        now = ctx.clock()
        a, c = self._fit.coefficients()
        mean_answer = self.mean_answer(model)
        # Before picker routed any prompt, a request waiting elsewhere is taken to be the size of this one: a
        # reported queue is work, never free.
        mean_prompt = self._prompt_tokens or max(uncached, default=0.0)
        s_tok = self.s_per_token
        speeds = self.speeds(endpoints)
        pool_cap = self.pool_capacity()
        leases_of = ctx.inflight.leases
        loads = [(leases_of(e.key), ctx.server_load(e)) for e in endpoints]
        requests = [load.requests for _, load in loads]
        mine = sum(len(leases) for leases, _ in loads)
        # All requests in flight at the candidates over picker's own: by Little's law the ratio of everyone's
        # arrivals to picker's (other replicas, clients that bypass picker), 1 when alone
        traffic = max(1.0, sum(requests) / mine) if mine else 1.0
        rate = self.arrivals_per_s
        share = self._share
        out: list[Estimate] = []
        for e, u, speed, (leases, load), n in zip(endpoints, uncached, speeds, loads, requests, strict=True):
            key = e.key
            cap = self.capacity(key, pool_cap)
            batch = n if not cap or n < cap else float(cap)
            self._batch[key] = batch
            step = speed * (a + c * (batch + 1.0))
            others_running = max(0.0, load.foreign_running + (load.own_requests - len(leases)))
            ahead_tokens = load.foreign_waiting * mean_prompt
            ahead_tokens += self._prefill_left(leases, now, speed * s_tok, step)
            m = e.metrics
            kv_tokens = float(m.num_gpu_blocks * (m.block_size or 16)) if m.num_gpu_blocks else math.inf
            run_s = u * s_tok * speed + answer * step
            wait, next_wait = self._start_wait(
                leases,
                others_running,
                load.foreign_waiting,
                Demand(run_s, u),
                cap or _NO_LIMIT,
                kv_tokens,
                step,
                speed * s_tok,
                mean_prompt,
                mean_answer,
                now,
            )
            lora_s = _adapter_wait(e, model, mean_answer * step, leases, self._adapters)
            fixed = wait + step + lora_s
            tokens = ahead_tokens + u
            ttft = fixed + (self.prefill_base_s + tokens * s_tok) * speed
            next_delay = next_wait - wait + u * s_tok * speed
            arrivals = rate * share.get(key, 0.0) * traffic
            hold = 0.0
            if next_wait > 0.0:  # full: a request arriving next would wait, and this one's run is part of why
                held = max(1.0 / cap if cap else 0.0, (u + answer) / kv_tokens)
                hold = arrivals * (ttft + run_s) * run_s * held
            out.append(Estimate(ttft, step, fixed, tokens, speed, wait, batch, next_delay, u, arrivals, hold))
        return out

    @staticmethod
    def _prefill_left(leases: Collection[Lease], now: float, s_per_token: float, step: float) -> float:
        """The prompt tokens picker's requests on a server still have to compute before their first tokens: the
        server computes them first come first served at ``1 / s_per_token`` tokens a second, from the end of the
        step the oldest one joined (a prompt is computed in steps: none is done before its first step ends; a
        request routed a moment ago behind a long prompt has nearly all of it left; one routed long ago, little)."""
        if not leases:
            return 0.0
        pending = [lease for lease in leases if lease.first_token_at is None]
        if not pending or s_per_token <= 0.0:
            return 0.0
        left = 0.0
        for lease in pending:
            left += lease.prefill_tokens
        drained = max(0.0, now - pending[0].started_at - step) / s_per_token
        return max(0.0, left - drained)

    def _start_wait(
        self,
        leases: Collection[Lease],
        others_running: float,
        others_waiting: float,
        ours: Demand,
        slots: int,
        kv_tokens: float,
        step: float,
        s_tok: float,
        mean_prompt: float,
        mean_answer: float,
        now: float,
    ) -> tuple[float, float]:
        """``start_wait_s`` on one server for this request and for a typical one right after it: picker's own
        requests by what each has left, the others' at means."""
        n = round(others_running)
        everyone_has_a_slot = len(leases) + n + 2 <= slots and round(others_waiting) == 0
        if everyone_has_a_slot and kv_tokens == math.inf:
            return 0.0, 0.0
        running: list[Demand] = []
        queued: list[Demand] = []
        for lease in leases:
            theirs = answer_tokens(lease.max_output_tokens, lease.fixed_output, self.mean_answer(lease.model))
            started = lease.first_token_at
            if started is not None:
                done = (now - started) / step
                running.append(Demand(max(step, (theirs - done) * step), lease.prefill_tokens + min(done, theirs)))
            else:
                (running if len(running) < slots else queued).append(
                    Demand(lease.prefill_tokens * s_tok + theirs * step, lease.prefill_tokens)
                )
        if everyone_has_a_slot:
            # None queued: both start at once if their KV fits beside what runs; the others' part summed as
            # start_waits_s sums it (same order, same answer) without building their demands and the queue
            used = 0.0
            for r in running:
                used += r.kv_tokens
            for i in range(n):
                used += _others_kv(mean_prompt, mean_answer, (i + 1) / (n + 1))
            if used + ours.kv_tokens <= kv_tokens and used + ours.kv_tokens + mean_prompt <= kv_tokens:
                return 0.0, 0.0
        whole = mean_answer * step
        for i in range(n):  # started at unknown times: their remaining answers spread evenly over one answer
            left = (i + 1) / (n + 1)
            (running if len(running) < slots else queued).append(
                Demand(whole * left, _others_kv(mean_prompt, mean_answer, left))
            )
        queued.extend([Demand(whole, mean_prompt)] * round(others_waiting))
        waits = start_waits_s(running, (*queued, ours, Demand(whole, mean_prompt)), slots, kv_tokens)
        return waits[-2], waits[-1]
