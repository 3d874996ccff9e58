"""Run one engine in virtual time: arrivals in, finished requests out, no sleeping.

The event order matches the real-time driver (``driver.py``): a request arriving while a step runs waits for
the next step; an idle engine starts a step the moment a request arrives (or a KV transfer lands); steps
follow each other back to back while there is work. The policy lab drives many engines with its own event
queue in the same way.
"""

from __future__ import annotations

from collections.abc import Iterable

from picker.sim.engine import Engine, RequestRejected, RequestState, SimRequest

__all__ = ["Rejected", "run_virtual"]


class Rejected:
    """A request the engine refused at ``time_s``."""

    __slots__ = ("error", "request", "time_s")

    def __init__(self, request: SimRequest, time_s: float, error: RequestRejected) -> None:
        self.request = request
        self.time_s = time_s
        self.error = error


def run_virtual(
    engine: Engine, arrivals: Iterable[tuple[float, SimRequest]], *, until_s: float = float("inf")
) -> list[RequestState | Rejected]:
    """Feed ``(time_s, request)`` arrivals (any order) to ``engine``; run until idle or ``until_s``.

    Returns one entry per arrival, in arrival order: the request's final state (finished, or still live at
    ``until_s``) or a ``Rejected``.
    """
    pending = sorted(arrivals, key=lambda a: a[0])
    results: list[RequestState | Rejected] = []
    i = 0
    now = pending[0][0] if pending else 0.0
    while True:
        end = engine.step_end_s
        if end is None and engine.has_work:
            end = engine.next_wakeup_s  # idle, waiting for a KV transfer to land
        next_arrival = pending[i][0] if i < len(pending) else None
        if end is not None and (next_arrival is None or end < next_arrival):
            # The step ends (or a transfer lands) before anything else happens.
            if end > until_s:
                break
            now = end
            if engine.step_end_s is not None:
                engine.finish_step()
        elif next_arrival is not None:
            if next_arrival > until_s:
                break
            now = next_arrival
            while i < len(pending) and pending[i][0] == now:
                t, req = pending[i]
                try:
                    results.append(engine.submit(req, t))
                except RequestRejected as exc:
                    results.append(Rejected(req, t, exc))
                i += 1
        else:
            break
        if engine.step_end_s is None and engine.has_work:
            engine.begin_step(now)
    return results
