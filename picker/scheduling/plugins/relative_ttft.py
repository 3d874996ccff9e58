"""relative-ttft-scorer (picker's): prefer endpoints that answer as fast as the rest of the pool.

Type ``relative-ttft-scorer`` (Distribution). The slow-server case that request counters get wrong: a server
running slower than its peers (a throttled or failing GPU, a noisy neighbour, a longer context) looks like any
other to a queue or in-flight count until its backlog has built up, and a cached prefix keeps sending it work.
This scorer sees it in the responses picker relays:

* every response gives a time to first token ``t`` and the tokens the server had to prefill ``u`` (prompt minus
  cached tokens from the response's usage; without usage, picker's own estimate at the pick);
* requests are grouped by ``u`` into size classes (< 128, < 512, < 2048, < 8192, more tokens), and the pool's
  typical TTFT of each class is a slow moving average ``ref[class]`` over all endpoints;
* a response that was not streamed has no TTFT (its body arrives whole at the end): its whole duration is the
  sample instead, compared within classes of prefill size x output length (< 16, < 128, < 512, more tokens);
* each response adds the sample ``t / ref[class]`` to its endpoint's last 16, of which those of the last
  ``memorySeconds`` count; the endpoint's slowness is their median (1: as fast as the pool for the same work;
  queueing counts, an overloaded server is slow too). The median, so one response stuck behind a long prompt does
  not mark a server slow; the age limit, so a shunned server that now gets a request every few seconds is
  believed as soon as it has recovered;
* a very late first token (``t`` over 8x ``ref[class]``) is the sample as soon as it arrives (the FirstToken
  hook, with picker's estimate of the prefill; the usage at the end takes it again if it shows another class), so
  a server that slow is seen within one TTFT, not after its slow answers end; any other response is sampled when
  it completes, since queueing alone makes first tokens a few times late;
* a streamed pick still waiting for its first token counts before it arrives once it has waited longer than 2x
  ``ref[class]`` and longer than the endpoint's slowness says it should: its wait so far is a sample its TTFT
  will exceed, so it joins the window's median as that (for as long as it waits, up to ``memorySeconds``), and a
  server that stops answering, or takes more work than it can keep up with, is seen while its first tokens are
  still missing;
* a sample moves ``ref`` at most as one of twice ``ref`` would, so a far slower server does not become the norm
  of its class;
* a response that first had to load its LoRA adapter is no sample: its wait says nothing of the server's speed;
* an endpoint with no sample in the last ``memorySeconds`` is tried again, not shunned for ever, but gradually:
  its slowness fades toward 1, halving its distance to 1 every ``memorySeconds / 2``, and the next sample starts
  a new window. Forgetting it at once would make a shunned, still slow server the best of every spread that
  balances by content (it took none for a while) and flood it.

Score: with ``ref`` the median slowness of the candidates that have one (the upper median for an even count;
in a pool of two, the faster of them; when only one candidate has samples, a full window of them, the others
count as 1, so a server that affinity sends everything to is still compared with the norm), ``1`` for an
endpoint within ``(1 + tolerance) * ref`` or without samples, else ``(1 + tolerance) * ref / slowness``:
ordinary jitter changes nothing, a server twice as slow as the pool scores about 0.6. How it behaves with slow
servers: docs/scheduling.md, "The previous default" (relative-ttft-scorer).

Parameters: ``tolerance`` 0.25 (≥ 0), ``memorySeconds`` 30 (> 0). Inputs: the PreRequest hook (picker's
uncached-token estimate from a prefix plugin earlier in the cycle), the FirstToken hook (TTFT), the PostResponse
hook (TTFT or duration, usage), the clock.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from pydantic import Field

from picker.plugins import (
    Category,
    CycleState,
    Endpoint,
    InferenceRequest,
    PluginContext,
    PluginParams,
    ResponseInfo,
    SchedulingResult,
)
from picker.scheduling.framework import Scorer
from picker.scheduling.plugins.prefix import MATCH_STATE, PrefixMatch
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "RelativeTtftScorer", "create", "size_class"]

TYPE = "relative-ttft-scorer"
_POOL_ALPHA = 0.05  # the pool's reference TTFT per size class moves slowly
_WINDOW = 16  # samples kept per endpoint
_CLASS_BOUNDS = (128, 512, 2048, 8192)  # prefilled tokens
_OUTPUT_BOUNDS = (16, 128, 512)  # output tokens of a non-streamed response
_SIZE_CLASSES = len(_CLASS_BOUNDS) + 1
_OUTPUT_CLASSES = len(_OUTPUT_BOUNDS) + 1
_MAX_PENDING = 65_536  # picks whose response never came back are forgotten past this many
_NO_SAMPLE = -1.0  # marks a pick whose response must not count (LoRA adapter load)
# A first token later than this many times the pool's TTFT for its class is a sample at once, not at the end of
# the response: a server that slow is seen within one TTFT, not after its slow answers end. Not lower: queueing
# alone makes first tokens a few times late, and sampling those early reacts to transient load.
_LATE_FIRST_TOKEN = 8.0
# A sample moves the pool's reference as one of at most this many times the reference would.
_REFERENCE_STEP = 2.0
# A pick still waiting for its first token counts in its endpoint's median once it has waited this many times the
# pool's TTFT for its class (and more than the endpoint's slowness): queueing alone makes first tokens up to that.
_OVERDUE = 2.0


class Params(PluginParams):
    tolerance: float = Field(default=0.25, ge=0.0)
    memory_seconds: float = Field(default=30.0, gt=0.0)


def size_class(prefilled_tokens: float) -> int:
    """The size class of a request that made the server prefill this many tokens (0 ... 4)."""
    return _bucket(prefilled_tokens, _CLASS_BOUNDS)


def _bucket(value: float, bounds: tuple[int, ...]) -> int:
    for i, bound in enumerate(bounds):
        if value < bound:
            return i
    return len(bounds)


@dataclass(slots=True)
class _Samples:
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW))  # TTFT / the pool's TTFT
    times: deque[float] = field(default_factory=lambda: deque(maxlen=_WINDOW))  # when each ratio was taken
    last_at: float = 0.0
    median: float = 1.0  # of ``ratios``, kept at each sample: read by up to three plugins per scheduling cycle
    # Streamed picks still waiting for their first token, oldest first: request id -> (picked at, size class).
    waiting: OrderedDict[str, tuple[float, int]] = field(default_factory=OrderedDict)


class RelativeTtftScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.DISTRIBUTION

    def __init__(self, name: str, params: Params, ctx: PluginContext) -> None:
        self.name = name
        self.params = params
        self._ctx = ctx
        # TTFT per size class, then whole durations per (size class, output class) of non-streamed responses.
        self._reference: list[float | None] = [None] * (_SIZE_CLASSES * (1 + _OUTPUT_CLASSES))
        self._samples: dict[str, _Samples] = {}
        self._fastest_reference: float | None = None  # the lowest TTFT reference of any size class
        self._sampled = False  # whether any endpoint has had a ratio
        self._expected_prefill: OrderedDict[str, float] = OrderedDict()  # request id -> uncached tokens at the pick
        # request id -> (endpoint, size class, ratio) of a sample taken at the first token, checked against usage
        self._first_samples: OrderedDict[str, tuple[str, int, float]] = OrderedDict()
        # request id -> the endpoint whose ``waiting`` holds it (the answer may name another: a fallback served it)
        self._waiting_on: dict[str, str] = {}

    def slowness(self, key: str) -> float | None:
        """Endpoint ``key``'s median TTFT relative to the pool's over its samples of the last ``memorySeconds``,
        fading toward 1 once even its newest sample is older, and raised by its overdue picks; None without a
        sample or an overdue pick."""
        s = self._samples.get(key)
        if s is None:
            return None
        now = self._ctx.clock()
        slowness: float | None = None
        current: Sequence[float] = ()  # the window's samples while they are current (not faded)
        if s.ratios:
            silent = self._silent_s(s, now)
            if silent > 0.0:
                slowness = 1.0 + (s.median - 1.0) * math.pow(0.5, silent / (0.5 * self.params.memory_seconds))
            else:
                horizon = now - self.params.memory_seconds
                if s.times[0] < horizon:  # samples older than memorySeconds leave the window while newer ones remain
                    while s.times and s.times[0] < horizon:
                        s.times.popleft()
                        s.ratios.popleft()
                    _keep_median(s)
                slowness = s.median if s.ratios else None
                current = s.ratios
        if s.waiting:
            return self._with_overdue(s, slowness, current, now)
        return slowness

    def _with_overdue(self, s: _Samples, slowness: float | None, current: Sequence[float], now: float) -> float | None:
        """``slowness`` with the endpoint's overdue picks in its median: each waited longer than ``_OVERDUE`` x and
        than ``slowness`` x its class's reference, so its TTFT will be a sample above the median of now."""
        fastest = self._fastest_reference
        if fastest is None:
            return slowness
        waiting = s.waiting
        horizon = now - self.params.memory_seconds
        while waiting and next(iter(waiting.values()))[0] < horizon:
            lost, _ = waiting.popitem(last=False)  # its response never reported: forgotten with age
            self._waiting_on.pop(lost, None)
        floor = _OVERDUE if slowness is None or slowness < _OVERDUE else slowness
        overdue: list[float] = []
        for picked_at, cls in waiting.values():
            waited = now - picked_at
            if waited <= floor * fastest:
                break  # the rest were picked later still
            ref = self._reference[cls]
            if ref is not None and waited > floor * ref:
                overdue.append(waited / ref)
                if len(overdue) == _WINDOW:
                    break
        if not overdue:
            return slowness
        # Faded samples are left out: the next sample would clear them.
        values = sorted((*current, *overdue))
        median = values[len(values) // 2]
        return median if slowness is None or median > slowness else slowness

    def _silent_s(self, samples: _Samples, now: float) -> float:
        """Seconds since the endpoint's newest sample beyond ``memorySeconds`` (≤ 0: heard from lately)."""
        return now - samples.last_at - self.params.memory_seconds

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        compared = self._compared(endpoints)
        if compared is None:
            return ScoreVector.constant(endpoints, 1.0)
        slow, limit = compared
        return ScoreVector(endpoints, [1.0 if x is None or x <= limit else limit / x for x in slow])

    def slowness_factors(self, endpoints: Sequence[Endpoint]) -> list[float]:
        """How many times slower than the tolerated band each endpoint answers: 1.0 within it (or without
        samples), else ``slowness / ((1 + tolerance) * ref)``, the inverse of its score. The prefix scorer's
        cold spread (``coldSpreadSpeedFrom``) and the token-load scorer's prefill mark (``prefillPendingSpeedFrom``)
        count each server in its own time by it."""
        compared = self._compared(endpoints)
        if compared is None:
            return [1.0] * len(endpoints)
        slow, limit = compared
        return [1.0 if x is None or x <= limit else x / limit for x in slow]

    def _compared(self, endpoints: Sequence[Endpoint]) -> tuple[list[float | None], float] | None:
        """Each endpoint's slowness (None: no recent sample) and the limit beyond which it counts as slow; None
        when no endpoint can be compared."""
        if not self._sampled and self._fastest_reference is None:
            return None  # no ratio yet and none to compare a wait with: every endpoint reads None
        slow = [self.slowness(e.key) for e in endpoints]
        seen = sorted(x for x in slow if x is not None)
        if len(endpoints) < 2 or not seen:
            return None
        if len(seen) == 1:
            # A single candidate observed (affinity sends it everything): once its window is full, the others
            # count as typical (1.0), so it is still compared with the pool's norm, not only with itself.
            observed = next(self._samples[e.key] for e, x in zip(endpoints, slow, strict=True) if x is not None)
            if len(observed.ratios) < _WINDOW:
                return None
            values = sorted(1.0 if x is None else x for x in slow)
        else:
            values = seen
        # The median, the upper one for an even count: a server is slow only when most of the pool is faster.
        # In a pool of two the upper median is the slower one itself, so the faster is the reference there.
        reference = values[len(values) // 2] if len(endpoints) > 2 else values[0]
        return slow, reference * (1.0 + self.params.tolerance)

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> None:
        if not result.targets:
            return
        target = result.targets[0]
        m = target.metrics
        if (m.running_loras or m.waiting_loras) and req.lora_adapter not in m.running_loras:
            tokens = _NO_SAMPLE
        else:
            match = result.cycle.get(MATCH_STATE) if result.cycle is not None else None
            tokens = match.uncached_tokens(target.key) if isinstance(match, PrefixMatch) else float(req.prompt_tokens)
        pending = self._expected_prefill
        pending[req.request_id] = tokens
        if len(pending) > _MAX_PENDING:
            pending.popitem(last=False)
        if tokens != _NO_SAMPLE and req.stream:  # a whole body has no first token to wait for
            waiting = self._samples.setdefault(target.key, _Samples()).waiting
            waiting[req.request_id] = (self._ctx.clock(), size_class(tokens))
            waiting_on = self._waiting_on
            waiting_on[req.request_id] = target.key
            if len(waiting_on) > _MAX_PENDING:  # the oldest pick of any endpoint, as for the expected prefills
                self._no_longer_waiting(next(iter(waiting_on)))

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> None:
        """A late first token counts at once; any other TTFT waits for its response to complete."""
        self._no_longer_waiting(req.request_id)
        if info.ttft_s is None or info.ttft_s <= 0.0:
            return
        expected = self._expected_prefill.get(req.request_id)
        if expected is None or expected == _NO_SAMPLE:
            return
        cls = size_class(expected)
        ref = self._reference[cls]
        if ref is None or info.ttft_s <= _LATE_FIRST_TOKEN * ref:
            return
        del self._expected_prefill[req.request_id]
        ratio = self._sample(info.endpoint_key, info.ttft_s, cls)
        if ratio is not None:
            taken = self._first_samples
            taken[req.request_id] = (info.endpoint_key, cls, ratio)
            if len(taken) > _MAX_PENDING:
                taken.popitem(last=False)

    def _no_longer_waiting(self, request_id: str) -> None:
        key = self._waiting_on.pop(request_id, None)
        samples = self._samples.get(key) if key is not None else None
        if samples is not None:
            samples.waiting.pop(request_id, None)

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> None:
        self._no_longer_waiting(req.request_id)
        taken = self._first_samples.pop(req.request_id, None)
        if taken is not None:
            self._correct(taken, info)
            return
        expected = self._expected_prefill.pop(req.request_id, None)
        if expected == _NO_SAMPLE:
            return
        if info.status is not None and info.status != 200:
            return
        if info.prompt_tokens is not None and info.cached_tokens is not None:
            prefilled = float(info.prompt_tokens - info.cached_tokens)
        elif expected is not None:
            prefilled = expected
        else:
            prefilled = float(req.prompt_tokens)
        if info.ttft_s is not None and info.ttft_s > 0.0:
            latency, cls = info.ttft_s, size_class(prefilled)
        elif info.duration_s is not None and info.duration_s > 0.0 and info.completion_tokens:
            output = _bucket(info.completion_tokens, _OUTPUT_BOUNDS)
            latency, cls = info.duration_s, _SIZE_CLASSES + size_class(prefilled) * _OUTPUT_CLASSES + output
        else:
            return
        self._sample(info.endpoint_key, latency, cls)

    def _correct(self, taken: tuple[str, int, float], info: ResponseInfo) -> None:
        """The usage of a response sampled at its first token: when the server prefilled a different size class
        than picker expected (a prefix it had evicted, one picker did not know of), the sample is taken again
        against that class's reference."""
        key, cls, ratio = taken
        if info.prompt_tokens is None or info.cached_tokens is None or info.ttft_s is None:
            return
        actual = size_class(info.prompt_tokens - info.cached_tokens)
        samples = self._samples.get(key)
        if actual == cls or samples is None:
            return
        try:
            i = samples.ratios.index(ratio)
        except ValueError:  # gone already: the window moved on or was cleared
            return
        del samples.ratios[i]
        del samples.times[i]
        if self._sample(key, info.ttft_s, actual) is None:
            _keep_median(samples)

    def _sample(self, key: str, latency: float, cls: int) -> float | None:
        """Count a TTFT (or duration) of class ``cls`` for ``key``; the ratio it added, None when it only set the
        class's first reference."""
        ref = self._reference[cls]
        if ref is None:
            self._reference[cls] = latency
            self._keep_fastest_reference()
            return None  # the first response of a class only sets the pool's reference
        # A late sample moves the pool's reference as one at _REFERENCE_STEP x would: a server far slower than the
        # rest must not make itself the norm.
        self._reference[cls] = ref + _POOL_ALPHA * (min(latency, _REFERENCE_STEP * ref) - ref)
        if cls < _SIZE_CLASSES:
            self._keep_fastest_reference()
        samples = self._samples.setdefault(key, _Samples())
        now = self._ctx.clock()
        if self._silent_s(samples, now) > 0.0:
            samples.ratios.clear()  # after a silence the old samples say little of the server now
            samples.times.clear()
        ratio = latency / ref
        self._sampled = True
        samples.ratios.append(ratio)
        samples.last_at = now
        samples.times.append(now)
        _keep_median(samples)
        return ratio

    def _keep_fastest_reference(self) -> None:
        ttft = [r for r in self._reference[:_SIZE_CLASSES] if r is not None]
        self._fastest_reference = min(ttft) if ttft else None

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        for key in [k for k in self._samples if k not in keys]:
            for request_id in self._samples.pop(key).waiting:
                self._waiting_on.pop(request_id, None)


def _keep_median(samples: _Samples) -> None:
    ordered = sorted(samples.ratios)
    samples.median = ordered[len(ordered) // 2] if ordered else 1.0


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return RelativeTtftScorer(name, params, ctx)


SPEC = PluginSpec(TYPE, Params, create)
