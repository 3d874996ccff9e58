"""Background tasks (discovery, scrape, KV events, peers, lease expiry) run in one TaskGroup, each behind a guard
that logs a crash or an early return and restarts the task with backoff, so one failing loop never stops the rest.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["guard", "supervise"]

log = logging.getLogger("picker")


async def supervise(tasks: Sequence[tuple[str, Callable[[], Awaitable[None]]]]) -> None:
    """Run every background task, each behind a guard, in one TaskGroup until cancelled."""
    async with asyncio.TaskGroup() as tg:
        for name, start in tasks:
            tg.create_task(guard(name, start), name=f"picker-{name}")


async def guard(name: str, start: Callable[[], Awaitable[None]]) -> None:
    """Run a background task; log a crash or an early return and restart it with backoff. Never raises."""
    backoff_s = 1.0
    while True:
        began = time.monotonic()
        try:
            await start()
            log.error("background task returned early; restarting", extra={"task": name})
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background task crashed; restarting", extra={"task": name})
        if time.monotonic() - began > 60.0:
            backoff_s = 1.0  # it ran a good while: a fresh failure, not a crash loop
        await asyncio.sleep(backoff_s)
        backoff_s = min(backoff_s * 2, 30.0)
