"""Real-time pacing of one engine: a single asyncio task steps it on a timer and wakes waiting requests.

Cost model: per engine one task and one timer per step; per request one ``asyncio.Event`` set at most once
per step. No task or timer per token.

Timeline: while the engine stays busy, each step starts where the previous one was planned to end (so asyncio's
~1 ms oversleep does not slow the token rate), or at the last arrival if that is later (no request is served
before it arrived); when the loop falls more than ``lag_tolerance_s`` behind (the machine is overloaded) or the
engine was idle, the step starts at the wall clock. ``max_lag_s`` records the worst lag seen, the sign that more
simulated servers run than the CPU can pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from picker.sim.engine import Engine, RequestState, SimRequest

__all__ = ["EngineDriver", "RequestHandle"]


class RequestHandle:
    """A live request as its HTTP handler sees it: the engine's state plus a wake-up."""

    __slots__ = ("_event", "state")

    def __init__(self, state: RequestState) -> None:
        self.state = state
        self._event = asyncio.Event()

    def notify(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        """Return once the request got tokens or finished since the last call."""
        await self._event.wait()
        self._event.clear()


class EngineDriver:
    """Steps ``engine`` in real time; ``run()`` is the one task (cancel it to stop)."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_updates: Callable[[list[RequestState]], None] | None = None,
        stall_s: Callable[[], float] | None = None,
        lag_tolerance_s: float = 0.010,
        on_step: Callable[[float], None] | None = None,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self._on_updates = on_updates
        self._on_step = on_step  # after every step, with its end time (the KV-event publisher flushes there)
        self._stall_s = stall_s
        self._lag_tolerance_s = lag_tolerance_s
        self._handles: dict[str, RequestHandle] = {}
        self._wake = asyncio.Event()
        self.max_lag_s = 0.0
        self._last_submit_s = float("-inf")

    def submit(self, req: SimRequest) -> RequestHandle:
        """Queue ``req`` now; raises ``engine.RequestRejected``."""
        now = self.clock()
        handle = RequestHandle(self.engine.submit(req, now))
        self._last_submit_s = now
        self._handles[req.request_id] = handle
        self._wake.set()
        return handle

    def abort(self, request_id: str) -> None:
        self._handles.pop(request_id, None)
        self.engine.abort(request_id, self.clock())

    def reset(self) -> None:
        """Crash the engine: every live request ends with ``abort`` and its handler is woken."""
        for state in self.engine.reset(self.clock()):
            handle = self._handles.pop(state.request_id, None)
            if handle is not None:
                handle.notify()

    async def run(self) -> None:
        engine = self.engine
        prev_end: float | None = None
        while True:
            if not engine.has_work:
                prev_end = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = self.clock()
            if prev_end is None or now - prev_end > self._lag_tolerance_s:
                start = now
            else:  # back to back, but never before a request it may admit arrived
                start = max(prev_end, self._last_submit_s)
            end = engine.begin_step(start, stall_s=self._stall_s() if self._stall_s else 0.0)
            if end is None:  # work exists but none is schedulable: KV transfers in flight (or a bad config)
                prev_end = None
                wakeup = engine.next_wakeup_s
                timeout = 0.001 if wakeup is None else max(0.0, wakeup - self.clock())
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            delay = end - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if engine.step_end_s != end:  # reset() during the step
                prev_end = None
                continue
            self.max_lag_s = max(self.max_lag_s, self.clock() - end)
            prev_end = end
            updates = engine.finish_step()
            handles = self._handles
            for state in updates:
                handle = handles.get(state.request_id)
                if handle is not None:
                    handle.notify()
                    if state.finished:
                        del handles[state.request_id]
            if self._on_updates is not None and updates:
                self._on_updates(updates)
            if self._on_step is not None:
                self._on_step(end)
