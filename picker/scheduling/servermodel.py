"""The server model: what a request would wait and cost on each model server, in seconds.

A model server (vLLM, SGLang, ...) runs at most ``capacity`` sequences at once (``max_num_seqs``, or fewer when
its KV cache is full); the rest wait, first come first served. A request's time to first token on server ``e``:

    ttft_e = slot_wait_e + (prefill_ahead_e + uncached_e) * s_per_token * speed_e + step_e

* ``slot_wait_e``: 0 while a slot is free. On a full server, the time until a slot frees for this request: the
  running requests' remaining answers (picker's own known request by request: tokens left = expected answer -
  time since its first token / step; others' spread evenly over the mean answer), then each request queued ahead taking
  the next free slot for its whole answer.
* ``prefill_ahead_e``: the prompt tokens of the requests there still waiting for their first token (picker's own,
  as estimated when it routed them; others' waiting ones at the mean prompt), computed before or with this one.
* ``uncached_e``: this prompt's tokens that server does not cache (the prefix index, when one is bound).
* a LoRA adapter not loaded where every adapter slot is taken waits for one to drain (about half an answer).
* ``step_e``: the server's engine step, i.e. its time per output token, with this request in its batch:
  ``speed_e * (a + c * (batch_e + 1))``. A decode step reads the weights once and each sequence's KV: its time
  grows with the batch. ``a`` and ``c`` are fitted over the pool to picker's observed TPOTs against the batch each
  request ran in; ``speed_e`` is how much slower than that fit the server has been (a throttled or shared GPU);
  a slow server is slow at prefill too. At least one step emits the first token.

Capacity is learned from what each server reports: the most requests it ran while some waited (a server never
seen full takes the pool's median of the learned ones; none learned: no slot limit). ``s_per_token`` is learned
from picker's own first tokens (the part of each observed TTFT beyond the predicted fixed part, per token,
divided by that server's speed), starting from ``DEFAULT_S_PER_TOKEN``. The mean answer per model is learned
from completions. The objective is the request's expected end to end time, ``ttft_e + (answer - 1) * step_e``:
for a short answer its TTFT, for a long one mostly its TPOT.

Traffic picker did not route (other replicas, clients that bypass picker) enters through the servers' reported
counts (``PluginContext.server_load``).
"""

from __future__ import annotations

import heapq
import statistics
from collections import deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from picker.endpoints.inflight import Lease
from picker.endpoints.model import Endpoint
from picker.plugins.api import PluginContext

__all__ = [
    "DEFAULT_ANSWER_TOKENS",
    "DEFAULT_STEP_S",
    "DEFAULT_S_PER_TOKEN",
    "Estimate",
    "ServerModel",
    "StepFit",
    "answer_tokens",
    "slot_wait_s",
]

DEFAULT_STEP_S = 0.02  # an engine step before any TPOT is observed
DEFAULT_S_PER_TOKEN = 1e-4  # prefill seconds per prompt token before any first token is observed
DEFAULT_ANSWER_TOKENS = 256.0  # a model's mean answer before any completion is seen
_ALPHA = 0.05  # moving averages over about the last 20 observations
_MIN_PREFILL_TOKENS = 8  # a first token teaches the prefill rate only when it had this many tokens to compute
_PREFILL_SAMPLES = 64  # the prefill rate is the median of this many recent samples (one long queue is no rate)
_FIT_ALPHA = 0.02  # the step-time fit: exponentially weighted over about the last 50 completions


@dataclass(frozen=True, slots=True)
class Estimate:
    """One candidate's prediction for one request."""

    ttft_s: float
    tpot_s: float
    fixed_s: float  # the part of ttft_s that does not scale with prefill tokens
    prefill_tokens: float  # the tokens computed before this request's first token (ahead of it and its own)
    speed: float  # how much slower than the pool's fit the server has been
    slot_wait_s: float = 0.0  # the part of ttft_s spent waiting for a sequence slot
    batch: float = 0.0  # the requests the server runs, as estimated

    def e2e_s(self, answer_tokens: float) -> float:
        return self.ttft_s + max(0.0, answer_tokens - 1.0) * self.tpot_s


def answer_tokens(max_tokens: int, fixed: bool, mean: float) -> float:
    """Expected answer length: exact when fixed, else the model's recent mean, capped by ``max_tokens``."""
    if fixed and max_tokens > 0:
        return float(max_tokens)
    return min(mean, float(max_tokens)) if max_tokens > 0 else mean


def slot_wait_s(running_left_s: list[float], queued_s: Sequence[float], capacity: int) -> float:
    """Seconds until a slot frees for a request behind ``queued_s`` (each takes the next free slot for that long)
    on a server whose ``capacity`` slots run requests with ``running_left_s`` to go; 0 with a slot free."""
    if len(running_left_s) < capacity:
        return 0.0
    heap = running_left_s
    heapq.heapify(heap)
    for duration in queued_s:
        heapq.heapreplace(heap, heap[0] + duration)
    return heap[0]


def _adapter_wait(endpoint: Endpoint, adapter: str, answer_s: float) -> float:
    """A LoRA adapter that is not loaded where every adapter slot is taken waits for one to drain: about half an
    answer. Loaded, or with a slot free (loading takes about a step), nothing more. A server that reports no
    adapters (``max_loras`` 0) serves base models only as far as picker knows: nothing."""
    m = endpoint.metrics
    if m.max_loras <= 0 or adapter in m.running_loras:
        return 0.0
    if len(m.running_loras | m.waiting_loras) < m.max_loras:
        return 0.0
    return answer_s / 2.0


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
        """(a, c); ``(DEFAULT_STEP_S, 0)`` before any observation, ``c`` 0 while the batches seen hardly vary."""
        if self._n == 0:
            return DEFAULT_STEP_S, 0.0
        var = self._bb - self._b * self._b
        if var < 0.25:
            return self._t, 0.0
        c = max(0.0, (self._bt - self._b * self._t) / var)
        a = self._t - c * self._b
        if a <= 0.0:  # a fit through zero: the step is all per-sequence work
            return 1e-4, self._bt / self._bb if self._bb > 0.0 else 0.0
        return a, c


class ServerModel:
    """The learned part of the model (capacities, step times, prefill rate, answer lengths) and the estimate."""

    __slots__ = (
        "_answers",
        "_batch",
        "_capacity",
        "_ctx",
        "_fit",
        "_prefill_samples",
        "_prompt_tokens",
        "_speed",
        "s_per_token",
    )

    def __init__(self, ctx: PluginContext) -> None:
        self._ctx = ctx
        self._capacity: dict[str, int] = {}
        self._batch: dict[str, float] = {}  # the requests each server ran when last estimated
        self._speed: dict[str, float] = {}  # observed step / the fit's, per server
        self._fit = StepFit()
        self._answers: dict[str, float] = {}  # model -> mean answer tokens
        self._prompt_tokens = 0.0  # mean prompt tokens computed (for requests known only as a count); 0: none yet
        self._prefill_samples: deque[float] = deque(maxlen=_PREFILL_SAMPLES)
        self.s_per_token = DEFAULT_S_PER_TOKEN

    # -- learning ---------------------------------------------------------------------------------------------
    def observe_reports(self, endpoints: Sequence[Endpoint]) -> None:
        """Learn capacities: the most requests a server ran while some waited (fresh reports only)."""
        now = self._ctx.clock()
        max_age = self._ctx.metrics_max_age_s
        learned = self._capacity
        for e in endpoints:
            m = e.metrics
            if m.waiting > 0 and m.running > learned.get(e.key, 0) and now - m.updated_at <= max_age:
                learned[e.key] = m.running

    def capacity(self, key: str) -> int:
        """Learned slots of a server; the pool's median for one never seen full; 0: unknown (no limit)."""
        own = self._capacity.get(key)
        if own is not None:
            return own
        if not self._capacity:
            return 0
        return int(statistics.median(self._capacity.values()))

    def batch(self, key: str) -> float:
        """The requests ``key`` ran when it was last estimated (0: never)."""
        return self._batch.get(key, 0.0)

    def observe_step(self, key: str, batch: float, step_s: float) -> None:
        """Learn from one completed request's TPOT on ``key``, which ran in a batch of about ``batch`` requests."""
        a, c = self._fit.coefficients()
        predicted = a + c * batch
        speed = self._speed.get(key, 1.0)
        if predicted > 0.0:
            self._speed[key] = speed + 4 * _FIT_ALPHA * (step_s / predicted - speed)
        self._fit.add(batch, step_s / speed)

    def observe_answer(self, model: str, tokens: int) -> None:
        mean = self._answers.get(model)
        self._answers[model] = float(tokens) if mean is None else mean + _ALPHA * (tokens - mean)

    def mean_answer(self, model: str) -> float:
        return self._answers.get(model, DEFAULT_ANSWER_TOKENS)

    def observe_prompt(self, tokens: float) -> None:
        mean = self._prompt_tokens
        self._prompt_tokens = tokens if mean <= 0.0 else mean + _ALPHA * (tokens - mean)

    def observe_first_token(self, ttft_s: float, predicted: Estimate) -> None:
        """Learn the prefill rate from one observed TTFT against what was predicted for it (only requests predicted
        to get a slot at once: a slot wait mispredicted is no prefill time)."""
        tokens = predicted.prefill_tokens
        if tokens < _MIN_PREFILL_TOKENS or predicted.slot_wait_s > 0.0 or predicted.fixed_s > ttft_s:
            return
        samples = self._prefill_samples
        samples.append((ttft_s - predicted.fixed_s) / (tokens * predicted.speed))
        self.s_per_token = statistics.median(samples)

    def forget(self, keys: Collection[str]) -> None:
        """Drop what was learned of servers that left the pool."""
        for table in (self._capacity, self._batch, self._speed):
            for key in [k for k in table if k not in keys]:
                del table[key]

    # -- estimating -------------------------------------------------------------------------------------------
    def estimate(
        self, model: str, answer: float, uncached: Sequence[float], endpoints: Sequence[Endpoint]
    ) -> list[Estimate]:
        """Each candidate's estimate for a request of ``model`` (a base model or LoRA adapter) with ``uncached``
        prompt tokens per candidate."""
        ctx = self._ctx
        now = ctx.clock()
        a, c = self._fit.coefficients()
        mean_answer = self.mean_answer(model)
        mean_prompt = self._prompt_tokens
        s_tok = self.s_per_token
        out: list[Estimate] = []
        for e, u in zip(endpoints, uncached, strict=True):
            key = e.key
            leases = ctx.inflight.leases(key)
            load = ctx.server_load(e)
            cap = self.capacity(key)
            batch = load.requests if not cap or load.requests < cap else float(cap)
            self._batch[key] = batch
            speed = self._speed.get(key, 1.0)
            step = speed * (a + c * (batch + 1.0))
            others_running = max(0.0, load.foreign_running + (load.own_requests - len(leases)))
            ahead_tokens = load.foreign_waiting * mean_prompt
            for lease in leases:
                if lease.first_token_at is None:
                    ahead_tokens += lease.prefill_tokens
            wait = 0.0
            if cap and load.requests >= cap:
                wait = self._slot_wait(
                    leases, others_running, load.foreign_waiting, cap, step, speed * s_tok, mean_answer, now
                )
            fixed = wait + step + _adapter_wait(e, model, mean_answer * step)
            tokens = ahead_tokens + u
            out.append(Estimate(fixed + tokens * s_tok * speed, step, fixed, tokens, speed, wait, batch))
        return out

    def _slot_wait(
        self,
        leases: Collection[Lease],
        others_running: float,
        others_waiting: float,
        capacity: int,
        step: float,
        s_tok: float,
        mean_answer: float,
        now: float,
    ) -> float:
        """``slot_wait_s`` for a full server: picker's own requests by what each has left, the others' at means."""
        running: list[float] = []
        queued: list[float] = []
        for lease in leases:
            out = answer_tokens(lease.max_output_tokens, lease.fixed_output, self.mean_answer(lease.model)) * step
            started = lease.first_token_at
            if started is not None:
                running.append(max(step, out - (now - started)))
            elif len(running) < capacity:
                running.append(lease.prefill_tokens * s_tok + out)
            else:
                queued.append(lease.prefill_tokens * s_tok + out)
        whole = mean_answer * step
        n = round(others_running)
        for i in range(n):  # started at unknown times: their remaining answers spread evenly over one answer
            (running if len(running) < capacity else queued).append(whole * (i + 1) / (n + 1))
        queued.extend([whole] * round(others_waiting))
        return slot_wait_s(running, queued, capacity)
