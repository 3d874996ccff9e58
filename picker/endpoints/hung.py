"""Hung-server detection from the request path: a server that takes requests and answers none is made suspect.

A model server can accept connections and never answer (a wedged engine, a stopped process, a GPU hang). Its
``/metrics`` may still answer, or go stale only after seconds; picker sees it sooner, in its own requests: each
watched request (one whose gateway will report the response) is registered when routed, with a deadline for its
first answer, and the answer (the first body bytes of a streamed response, the response itself otherwise) is
recorded when it comes. A server is **suspect** when one of its requests is past that deadline and nothing at all
came back from the server (no answer, no streamed chunk of any request) since that request was sent, or for its
**silence limit**, whichever is shorter: a busy or slow server keeps answering something, a hung one answers
nothing. A suspect server is left out of the candidate set (``Endpoint.suspect``; ``EndpointSnapshot.candidates``
falls back when nothing else is left) and comes back at its next sign of life. A server that stays silent is
readmitted on probation after ``probe_after_s`` (doubling with each suspicion in a row, at most
``max_probe_after_s``) once none of its requests is overdue any more: the next request it gets is the probe.

The silence limit is ``multiplier`` x the longest of the server's last ``window`` spacings between two first
answers with requests waiting all along (its pace when busy), at least ``min_silence_s``; none is known until it
has been busy so. A server that stops with requests already on it is then suspect once those are overdue and it has
been silent far longer than it ever is when working, not only once a request sent after its last answer is
overdue. Only first answers space it: the chunks of a streamed answer come far more often, and would make a pause
of the engine (a long prefill step) look like a hang.

The deadline of a request is ``max(min_overdue_s, multiplier x reference x nominal)``. ``nominal`` is a fixed
model of the request's cost (prompt tokens, and its expected output when the answer is the whole response), so one
learned number, the observed time over ``nominal``, compares requests of any size: the **reference** is the largest
of that server's last ``window`` ratios, or the pool's (the median of the servers' references), whichever is
larger. Until any server of the pool has answered, the deadline is ``cold_overdue_s`` (a fresh pool, a cold
start). At most ``max_suspect_fraction`` of the pool is suspect at once (at least one): everything overdue at
once is more likely the gateway than the servers.

A pure state machine on an injected clock; the director feeds it and applies the transitions it returns.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field

__all__ = ["HungDetector", "HungSettings", "Transition", "nominal_s"]

# The fixed cost model behind ``nominal_s``: only ratios to it are learned, so it needs the right shape, not the
# right scale. Prefill and decode speeds of a mid-size model on one accelerator.
_NOMINAL_BASE_S = 0.05
_NOMINAL_PROMPT_S_PER_TOKEN = 1e-4
_NOMINAL_OUTPUT_S_PER_TOKEN = 0.02


def nominal_s(prompt_tokens: int, output_tokens: int, *, whole_response: bool) -> float:
    """The modelled time until a request's first answer: its prefill, plus its decode when the answer is the end."""
    out = _NOMINAL_BASE_S + max(0, prompt_tokens) * _NOMINAL_PROMPT_S_PER_TOKEN
    if whole_response:
        out += max(0, output_tokens) * _NOMINAL_OUTPUT_S_PER_TOKEN
    return out


@dataclass(frozen=True, slots=True)
class HungSettings:
    multiplier: float = 2.0  # overdue after this many times the reference time
    min_overdue_s: float = 0.3  # never overdue sooner than this
    min_silence_s: float = 0.2  # the silence limit is never shorter than this
    cold_overdue_s: float = 10.0  # the deadline while no server of the pool has answered yet
    window: int = 32  # recent answers per server behind its reference
    probe_after_s: float = 5.0  # suspect this long without an answer: readmitted on probation
    max_probe_after_s: float = 60.0
    max_suspect_fraction: float = 0.5


@dataclass(frozen=True, slots=True)
class Transition:
    key: str
    suspect: bool  # True: now suspect; False: readmitted
    detail: str  # for the log line


@dataclass(slots=True)
class _Pending:
    started_at: float
    deadline: float
    nominal_s: float
    usual_at: float  # the deadline over ``multiplier``: when the slowest recent answer of its size would have come


@dataclass(slots=True)
class _State:
    ratios: deque[float]
    gaps: deque[float]  # between two first answers with requests waiting all along (seconds)
    reference: float | None = None  # max(ratios)
    gap_reference: float | None = None  # max(gaps)
    # Requests waiting for their first answer, in the order they were sent.
    pending: dict[Hashable, _Pending] = field(default_factory=dict)
    last_answer: float = float("-inf")  # anything at all came back from the server
    last_first_answer: float = float("-inf")  # the first answer of a request
    suspect_since: float | None = None
    suspicions: int = 0  # in a row, without an answer between them


class HungDetector:
    def __init__(self, settings: HungSettings | None = None) -> None:
        self.settings = settings or HungSettings()
        self._states: dict[str, _State] = {}
        self._pool_reference: float | None = None

    def _state(self, key: str) -> _State:
        state = self._states.get(key)
        if state is None:
            window = self.settings.window
            state = self._states[key] = _State(deque(maxlen=window), deque(maxlen=window))
        return state

    # -- the request path ----------------------------------------------------------------------------------

    def watch(self, key: str, request: Hashable, now: float, nominal: float) -> None:
        """A request was sent to ``key`` and its gateway will report the answer."""
        state = self._state(key)
        deadline_s = self.deadline_s(key, nominal)
        state.pending[request] = _Pending(now, now + deadline_s, nominal, now + deadline_s / self.settings.multiplier)

    def answered(self, key: str, request: Hashable, now: float, *, alive: bool = True) -> Transition | None:
        """The first answer of ``request`` came (``alive``: from the server itself, not a gateway's error)."""
        state = self._states.get(key)
        if state is None:
            return None
        if alive and request in state.pending:
            self._note_gap(state, now)  # before ``request`` leaves the waiting ones: its wait ends the gap
        pending = state.pending.pop(request, None)
        if not alive:
            return None
        if pending is not None:
            # An answer after its deadline counts as on time: a late answer measures the hang that just ended
            # more than the server, so the reference grows at most ``multiplier`` times per late answer.
            ratio = (min(now, pending.deadline) - pending.started_at) / pending.nominal_s
            state.ratios.append(ratio)
            if state.reference is None or ratio >= state.reference:
                state.reference = ratio
            elif len(state.ratios) == state.ratios.maxlen:
                state.reference = max(state.ratios)
            if self._pool_reference is None:
                self._pool_reference = state.reference
        return self.alive(key, now)

    def alive(self, key: str, now: float) -> Transition | None:
        """Something came back from ``key`` (a streamed chunk): it is not hung."""
        state = self._states.get(key)
        if state is None:
            return None
        state.last_answer = now
        state.suspicions = 0
        if state.suspect_since is None:
            return None
        held_s = now - state.suspect_since
        state.suspect_since = None
        return Transition(key, False, f"it answered again after {held_s:.2f} s")

    def _note_gap(self, state: _State, now: float) -> None:
        """A first answer came: record the time since the previous one if a request has waited since then (a
        server idle between them was not slow to answer; the wait of a request sent to an idle server is its
        deadline's business).

        Capped at the silence limit, as late answers are at their deadline: a hang that ends raises it at most
        ``multiplier`` times per answer.
        """
        previous, state.last_first_answer = state.last_first_answer, now
        if next(iter(state.pending.values())).started_at > previous:
            return
        gap = now - previous
        if state.gap_reference is not None:
            gap = min(gap, self._silence_limit_s(state))
        state.gaps.append(gap)
        if state.gap_reference is None or gap >= state.gap_reference:
            state.gap_reference = gap
        elif len(state.gaps) == state.gaps.maxlen:
            state.gap_reference = max(state.gaps)

    def _silence_limit_s(self, state: _State) -> float:
        """How long the server may be silent with a request waiting before an overdue one counts against it."""
        if state.gap_reference is None:
            return float("inf")  # nothing known of its pace: only a request sent after its last answer counts
        return max(self.settings.min_silence_s, self.settings.multiplier * state.gap_reference)

    def done(self, key: str, request: Hashable) -> None:
        """The request ended without an answer (client gone, stream reset): no longer waited for."""
        state = self._states.get(key)
        if state is not None:
            state.pending.pop(request, None)

    # -- the periodic check --------------------------------------------------------------------------------

    def deadline_s(self, key: str, nominal: float) -> float:
        """How long a request of ``nominal`` seconds sent to ``key`` now may wait for its first answer."""
        state = self._states.get(key)
        own = state.reference if state is not None else None
        pool = self._pool_reference
        if own is None and pool is None:
            return self.settings.cold_overdue_s
        reference = max(own or 0.0, pool or 0.0)
        return max(self.settings.min_overdue_s, self.settings.multiplier * reference * nominal)

    def check(self, now: float, pool: Iterable[str]) -> list[Transition]:
        """Suspect the servers with an overdue request and no answer since it was sent; probe the long-suspect.

        ``pool``: the keys of the pool's endpoints now (others are forgotten).
        """
        keys = set(pool)
        out: list[Transition] = []
        for key in [k for k in self._states if k not in keys]:
            if self._states.pop(key).suspect_since is not None:
                out.append(Transition(key, False, "it left the pool"))
        refs = [s.reference for s in self._states.values() if s.reference is not None]
        self._pool_reference = statistics.median_low(refs) if refs else None
        suspect = sum(1 for s in self._states.values() if s.suspect_since is not None)
        allowed = max(1, int(len(keys) * self.settings.max_suspect_fraction))
        for key, state in self._states.items():
            overdue = _overdue(state, now, self._silence_limit_s(state))
            if state.suspect_since is not None:
                if overdue is None and now - state.suspect_since >= self._hold_s(state):
                    out.append(Transition(key, False, f"on probation after {now - state.suspect_since:.2f} s"))
                    state.suspect_since = None
                continue
            if overdue is None or suspect >= allowed:
                continue
            state.suspect_since = now
            state.suspicions += 1
            suspect += 1
            silent_s = now - max(state.last_answer, overdue.started_at)
            out.append(Transition(key, True, f"{overdue.why} and nothing came back for {silent_s:.2f} s"))
        return out

    def _hold_s(self, state: _State) -> float:
        doubled = self.settings.probe_after_s * 2.0 ** max(0, state.suspicions - 1)
        return min(doubled, self.settings.max_probe_after_s)

    # -- inspection ------------------------------------------------------------------------------------------

    def suspect(self) -> frozenset[str]:
        return frozenset(k for k, s in self._states.items() if s.suspect_since is not None)

    def pending(self) -> int:
        """Requests waited for, over every server."""
        return sum(len(s.pending) for s in self._states.values())


@dataclass(frozen=True, slots=True)
class _Overdue:
    started_at: float
    why: str


def _overdue(state: _State, now: float, silence_limit_s: float) -> _Overdue | None:
    """The evidence against a server, if any: a request past its deadline with nothing from the server since it
    was sent or for ``silence_limit_s``; or, silent that long, two requests past the time the slowest recent
    answer of their size took (their deadline over ``multiplier``): two that corroborate each other need no
    margin each."""
    silent_long = state.gap_reference is not None and now - state.last_answer >= silence_limit_s
    late: _Pending | None = None
    for pending in reversed(state.pending.values()):
        if pending.started_at < state.last_answer and not silent_long:
            return None  # this one and every older one were sent before the server last answered
        if pending.deadline <= now:
            deadline_s = pending.deadline - pending.started_at
            return _Overdue(
                pending.started_at,
                f"a request waited {now - pending.started_at:.2f} s for its first answer (deadline {deadline_s:.2f} s)",
            )
        if silent_long and pending.usual_at <= now:
            if late is not None:
                usual_s = pending.usual_at - pending.started_at
                return _Overdue(
                    pending.started_at,
                    f"2 requests waited past the usual time for their first answer ({usual_s:.2f} s for the older)",
                )
            late = pending
    return None
