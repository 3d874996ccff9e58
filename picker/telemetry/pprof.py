"""``--enable-pprof``: Python profiling on the metrics port, at the reference's ``/debug/pprof/`` paths.

The reference serves Go's pprof. picker is Python, so the same paths answer with Python's equivalents, as text
(``go tool pprof`` can't read them):

* ``/debug/pprof/`` — this index.
* ``/debug/pprof/goroutine`` — the stack of every asyncio task and every thread, now.
* ``/debug/pprof/profile?seconds=N`` (default 10, at most 60) — a cProfile of the event loop's thread for N
  seconds, as ``pstats`` text sorted by cumulative time (``&sort=tottime`` to change it). One at a time: a
  second request while one runs gets 409.
* ``/debug/pprof/heap?limit=N`` (default 40) — the ``tracemalloc`` allocation sites (source lines) holding the
  most memory now, as ``<bytes> <blocks> <file>:<line>`` lines after a total; ``&traceback=1`` groups by whole
  stacks instead, each followed by its frames (as deep as ``PYTHONTRACEMALLOC=<frames>`` records). Tracing
  starts at the first request (or at start with ``PYTHONTRACEMALLOC=1``); it costs memory and CPU from then on.
  The sites are counted on a thread, so the event loop keeps serving (slower) meanwhile.

All from the standard library: nothing extra runs until a profile is asked for.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import sys
import threading
import traceback
import tracemalloc

from aiohttp import web

__all__ = ["MAX_PROFILE_S", "add_routes"]

MAX_PROFILE_S = 60.0
_SORTS = ("cumulative", "tottime", "calls", "ncalls")

_INDEX = """picker /debug/pprof/ (Python profiles, text)

goroutine             stacks of every asyncio task and thread
profile?seconds=N     cProfile of the event loop thread for N seconds (default 10, max 60), pstats text
heap?limit=N          tracemalloc's top allocation sites by size (tracing starts at the first request)
"""


def add_routes(app: web.Application) -> None:
    busy = asyncio.Lock()

    async def index(_: web.Request) -> web.Response:
        return web.Response(text=_INDEX)

    async def goroutine(_: web.Request) -> web.Response:
        return web.Response(text=stacks())

    async def profile(request: web.Request) -> web.Response:
        try:
            seconds = float(request.query.get("seconds", "10"))
        except ValueError:
            raise web.HTTPBadRequest(text="seconds must be a number\n") from None
        if not 0 < seconds <= MAX_PROFILE_S:
            raise web.HTTPBadRequest(text=f"seconds must be in (0, {MAX_PROFILE_S:g}]\n")
        sort = request.query.get("sort", "cumulative")
        if sort not in _SORTS:
            raise web.HTTPBadRequest(text=f"sort must be one of {', '.join(_SORTS)}\n")
        if busy.locked():
            raise web.HTTPConflict(text="a profile is already running\n")
        async with busy:
            profiler = cProfile.Profile()
            profiler.enable()  # this thread runs the event loop: every task's work in the window is counted
            try:
                await asyncio.sleep(seconds)
            finally:
                profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(sort).print_stats(80)
        return web.Response(text=out.getvalue())

    async def heap(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "40"))
        except ValueError:
            raise web.HTTPBadRequest(text="limit must be an integer\n") from None
        if not 0 < limit <= 10_000:
            raise web.HTTPBadRequest(text="limit must be in [1, 10000]\n")
        if not tracemalloc.is_tracing():
            tracemalloc.start()
            return web.Response(text="tracemalloc started: ask again for the allocation sites\n")
        # In a thread: grouping the traces is Python work of seconds, and the loop keeps serving meanwhile.
        stacks = request.query.get("traceback", "") in ("1", "true")
        return web.Response(text=await asyncio.to_thread(heap_sites, limit, stacks=stacks))

    app.router.add_get("/debug/pprof/", index)
    app.router.add_get("/debug/pprof/heap", heap)
    app.router.add_get("/debug/pprof/goroutine", goroutine)
    app.router.add_get("/debug/pprof/profile", profile)


def heap_sites(limit: int, *, stacks: bool = False) -> str:
    """The traced total, then the ``limit`` source lines (``stacks``: whole stacks) holding the most memory."""
    snapshot = tracemalloc.take_snapshot().filter_traces((tracemalloc.Filter(False, tracemalloc.__file__),))
    stats = snapshot.statistics("traceback" if stacks else "lineno")
    current, peak = tracemalloc.get_traced_memory()
    out = io.StringIO()
    out.write(f"traced: {current} bytes now, {peak} bytes at peak, {len(stats)} sites\n")
    for stat in stats[:limit]:
        frame = stat.traceback[0]
        out.write(f"{stat.size} {stat.count} {frame.filename}:{frame.lineno}\n")
        if stacks:
            out.writelines(f"    {f.filename}:{f.lineno}\n" for f in stat.traceback)
    return out.getvalue()


def stacks() -> str:
    """Every asyncio task's stack (of this loop) and every thread's, as text."""
    out = io.StringIO()
    tasks = sorted(asyncio.all_tasks(), key=lambda t: t.get_name())
    out.write(f"asyncio tasks: {len(tasks)}\n\n")
    for task in tasks:
        out.write(f"task {task.get_name()} ({task.get_coro()!r})\n")
        for frame in task.get_stack():
            out.write("".join(traceback.format_stack(frame, limit=1)))
        out.write("\n")
    names = {t.ident: t.name for t in threading.enumerate()}
    frames = sys._current_frames()
    out.write(f"threads: {len(frames)}\n\n")
    for ident, frame in frames.items():
        out.write(f"thread {names.get(ident, '?')} ({ident})\n")
        out.write("".join(traceback.format_stack(frame)))
        out.write("\n")
    return out.getvalue()
