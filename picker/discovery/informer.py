"""Informer: a list-then-watch cache of one Kubernetes collection, kept in step with the API server.

The loop (the client-go reflector's contract, rebuilt on ``KubeApi``):

1. **List** the collection; replace the cache with the items; remember the list's resourceVersion (RV).
2. **Watch** from that RV with ``allowWatchBookmarks``: ADDED/MODIFIED store the object, DELETED drops it, every
   event and every BOOKMARK advances the RV. When the server ends the watch (``timeoutSeconds``, drawn in
   ``[t, 2t)`` so many clients do not reconnect together) or the connection breaks, watch again **from the last RV**:
   the server replays what happened in between, so nothing is lost and nothing is re-listed.
3. **410 Gone** (HTTP status or ERROR event: the RV fell out of the server's history) ⇒ list again (step 1).
4. **Resync**: every ``resync_s`` list again anyway, so a cache can never drift for long whatever went wrong.
5. Failures back off exponentially from ``backoff_initial_s`` to ``backoff_max_s`` with jitter (each delay drawn in
   ``[d/2, d)``); any success resets the backoff.
6. **Absent**: a 404 on list means the resource type is not installed (an optional CRD); the cache is emptied,
   ``absent`` is set (logged once, at info) and the list is retried every ``absent_recheck_s``.
7. **Forbidden**: a 403 on list means picker's Role lacks the rule: one error line naming the rule, then retries
   with backoff (quietly) until the list succeeds.

``on_change(informer, name)`` is called (on the event loop, synchronously) after every list (``name`` None: the
whole cache was replaced) and after every event, with the name of the object it added, changed or deleted;
bookmarks do not call it. ``synced`` turns True after the first successful list (or a 404).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from picker.discovery.kubeapi import (
    KubeApi,
    KubeApiError,
    ListResult,
    Resource,
    ResourceForbidden,
    ResourceGone,
    ResourceNotFound,
)

__all__ = ["Informer", "InformerTiming", "backoff_delay"]

log = logging.getLogger(__name__)

_CLIENT_GRACE_S = 5.0  # the client ends a watch this long after its timeoutSeconds if the server has not


@dataclass(frozen=True, slots=True)
class InformerTiming:
    resync_s: float = 300.0
    watch_timeout_s: float = 300.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 4.0  # also how long an API outage can hide a change once the API is back
    absent_recheck_s: float = 60.0


def backoff_delay(failures: int, timing: InformerTiming, rng: random.Random) -> float:
    """Delay before retry number ``failures`` (1-based): exponential, capped, jittered into ``[d/2, d)``."""
    exponent = min(max(failures - 1, 0), 30)
    capped = min(timing.backoff_max_s, timing.backoff_initial_s * 2.0**exponent)
    return capped * (0.5 + 0.5 * rng.random())


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _slim(obj: dict[str, Any]) -> dict[str, Any]:
    # managedFields is often most of an object's size and nothing here reads it.
    _meta(obj).pop("managedFields", None)
    return obj


class Informer:
    """Cache of one collection (objects by ``metadata.name``) and the loop that keeps it current."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        *,
        on_change: Callable[[Informer, str | None], None],
        timing: InformerTiming,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        self.resource = resource
        self.items: dict[str, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = False
        self.absent = False
        self.forbidden = False  # the last list was refused (403); reported once per streak
        self.lists = 0  # successful lists, the first included
        self._api = api
        self._on_change = on_change
        self._timing = timing
        self._clock = clock
        self._rng = rng

    async def run(self) -> NoReturn:
        """List, watch, relist when needed; until cancelled."""
        failures = 0
        unproductive = 0  # relists in a row whose watch failed (410) before delivering anything
        while True:
            try:
                listed = await self._api.list(self.resource)
            except ResourceNotFound:
                self._set_absent()
                failures = 0
                await asyncio.sleep(self._timing.absent_recheck_s)
                continue
            except ResourceForbidden as exc:
                failures += 1
                delay = backoff_delay(failures, self._timing, self._rng)
                self._report_forbidden("list", exc, delay)
                await asyncio.sleep(delay)
                continue
            except KubeApiError as exc:
                failures += 1
                delay = backoff_delay(failures, self._timing, self._rng)
                log.warning("kubernetes: list %s failed (%s); retrying in %.2fs", self.resource, exc, delay)
                await asyncio.sleep(delay)
                continue
            failures = 0
            self._replace(listed)
            if await self._watch_until_relist():
                unproductive = 0
            else:
                # Listing, then being told at once that the list's version is gone, again and again: back off.
                unproductive += 1
                await asyncio.sleep(backoff_delay(unproductive, self._timing, self._rng))

    async def _watch_until_relist(self) -> bool:
        """Watch from the current RV, re-watching as needed, until a relist is due.

        Returns whether the watches made progress (delivered an event or ran until the resync).
        """
        deadline = self._clock() + self._timing.resync_s
        failures = 0
        progressed = False
        while True:
            remaining = deadline - self._clock()
            if remaining <= 0:
                log.debug("kubernetes: periodic resync of %s", self.resource)
                return True
            wt = self._timing.watch_timeout_s
            timeout_s = min(remaining, self._rng.uniform(wt, 2 * wt))
            started = self._clock()
            received = 0
            try:
                # The server ends the watch after timeoutSeconds (whole seconds); the client ends it at the resync
                # deadline, or a grace period after timeoutSeconds if the server does not.
                async with asyncio.timeout(min(remaining, timeout_s + _CLIENT_GRACE_S)):
                    events = self._api.watch(self.resource, self.resource_version, timeout_s)
                    async with contextlib.aclosing(events):
                        async for event in events:
                            self._apply(event)
                            received += 1
                            progressed = True
            except ResourceGone as exc:
                log.info(
                    "kubernetes: watch of %s expired at RV %s (%s); relisting",
                    self.resource,
                    self.resource_version,
                    exc,
                )
                return progressed
            except (ResourceNotFound, ResourceForbidden):
                # The resource type went away, or the right to watch it: the list finds out and says so.
                return progressed
            except KubeApiError as exc:
                failures += 1
                delay = backoff_delay(failures, self._timing, self._rng)
                log.warning("kubernetes: watch %s failed (%s); re-watching in %.2fs", self.resource, exc, delay)
                await asyncio.sleep(delay)
                continue
            except TimeoutError:
                pass  # the resync deadline, or a server that kept the watch open past its timeout
            if received or self._clock() - started >= timeout_s / 2:
                failures = 0
            else:
                # A watch that ends at once without a word is a failure too; do not spin on it.
                failures += 1
                await asyncio.sleep(backoff_delay(failures, self._timing, self._rng))

    def _report_forbidden(self, verb: str, exc: KubeApiError, delay_s: float) -> None:
        """A missing RBAC rule: one error line per streak that says which rule, then quiet retries."""
        if self.forbidden:
            log.debug("kubernetes: %s %s still forbidden; retrying in %.2fs", verb, self.resource, delay_s)
            return
        self.forbidden = True
        r = self.resource
        log.error(
            "kubernetes: FORBIDDEN: picker may not %s %s (%s). Its ServiceAccount's Role must grant get, list and "
            "watch on %s in API group %r in namespace %s (the chart's Role does); retrying quietly until it can",
            verb,
            r,
            exc,
            r.plural,
            r.group,
            r.namespace,
        )

    def _replace(self, listed: ListResult) -> None:
        if self.forbidden:
            log.info("kubernetes: %s is readable now", self.resource)
            self.forbidden = False
        self.items = {str(_meta(o).get("name")): _slim(o) for o in listed.items if _meta(o).get("name")}
        self.resource_version = listed.resource_version
        if self.absent:
            log.info("kubernetes: %s is now available", self.resource)
        self.absent = False
        self.synced = True
        self.lists += 1
        self._on_change(self, None)

    def _set_absent(self) -> None:
        if not self.absent:
            log.info(
                "kubernetes: %s is not installed (404); checking again every %.0fs",
                self.resource,
                self._timing.absent_recheck_s,
            )
        changed = bool(self.items) or not self.absent or not self.synced
        self.items = {}
        self.resource_version = ""
        self.absent = True
        self.synced = True
        if changed:
            self._on_change(self, None)

    def _apply(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        obj: dict[str, Any] = event["object"]
        rv = str(_meta(obj).get("resourceVersion") or "")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        name = str(_meta(obj).get("name") or "")
        if kind in ("ADDED", "MODIFIED") and name:
            self.items[name] = _slim(obj)
        elif kind == "DELETED" and name:
            self.items.pop(name, None)
        else:
            log.warning("kubernetes: ignoring watch event %r of %s", kind, self.resource)
            return
        if rv:
            self.resource_version = rv
        self._on_change(self, name)
