"""The large-pool pre-filter: score only the k least loaded candidates plus the prefix holders.

Every scorer loops over every candidate, so a cycle's cost grows with the pool (docs/performance.md, "Native
code and its pure-Python twins"). Before the scorers of a profile run (after its filters), a pool of more than ``k``
candidates is cut to

    the k candidates with the fewest estimated in-flight tokens (``PluginContext.server_tokens``: picker's
    ledger plus what the server last reported beyond it; ties: the earlier candidate)
  and every candidate that holds at least one of the request's prefix blocks (any prefix plugin's index)

in their original order. A pool of k or fewer candidates is passed on as the very same sequence, so decisions
(and the random tie-breaks) are unchanged there. What it can change at larger pools: a candidate outside both
sets is never scored, so a scorer that would have preferred it for another reason does not get the chance - an
endpoint with a LoRA adapter loaded but more load than the k-th, the emptiest cache (``coldSpread``) among the
busier endpoints, a server with a fast TTFT among the busier ones; min-max scorers (queue, running, kv-cache)
normalize over the kept set.
The cut costs one pass over the pool (the token estimate and the selection, in C when ``scheduling.native`` is
built, else ``serverload.tokens_of`` and ``py_select``) instead of every scorer's. In C, the pool's reported loads
are read once per candidate tuple (``_native.LoadTable``: the snapshot's candidates are the same tuple from one
scrape tick to the next), so a request reads a few arrays and its ledger rather than every endpoint's objects.

``k`` is ``--prefilter-endpoints`` (``Settings.prefilter_endpoints``, default 64; 0: off). The policy lab and
``Scheduler(...)`` without it do not cut.
"""

from __future__ import annotations

import heapq
from collections.abc import Container, Mapping, Sequence
from typing import Protocol, runtime_checkable

from picker.endpoints.model import Endpoint
from picker.request.model import InferenceRequest
from picker.scheduling import native
from picker.scheduling.framework import CycleState, PluginContext

__all__ = ["Prefilter", "PrefixHolders", "py_select"]


@runtime_checkable
class PrefixHolders(Protocol):
    """A plugin that knows which endpoints hold a request's prefix (``prefix-cache-scorer``)."""

    def prefix_holders(
        self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState
    ) -> Mapping[str, int]: ...


class Prefilter:
    __slots__ = ("_ctx", "_holders", "_table", "k")

    def __init__(self, k: int, ctx: PluginContext, holders: Sequence[PrefixHolders] = ()) -> None:
        self.k = k
        self._ctx = ctx
        self._holders = tuple(holders)
        fast = native.module
        self._table = fast.LoadTable() if fast is not None else None

    def apply(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> Sequence[Endpoint]:
        """``endpoints`` cut to the k least loaded plus the prefix holders (itself when k or fewer)."""
        k = self.k
        if k <= 0 or len(endpoints) <= k:
            return endpoints
        held: set[str] = set()
        for source in self._holders:
            held.update(source.prefix_holders(req, endpoints, cycle))
        fast = native.module
        table = self._table
        if fast is not None and table is not None:
            # The snapshot's candidate tuple, seen before: its reported loads are already in the table's arrays.
            found: list[Endpoint] | None = table.select(endpoints, *native.token_load_args(self._ctx), k, held)
            if found is not None:
                return found
        loads = native.server_tokens(self._ctx, endpoints)
        if fast is not None:
            kept: list[Endpoint] | None = fast.select(endpoints, loads, k, held)
            if kept is not None:
                return kept
        return py_select(endpoints, loads, k, held)


def py_select(endpoints: Sequence[Endpoint], loads: Sequence[float], k: int, held: Container[str]) -> list[Endpoint]:
    """The endpoints among the k least loaded (ties: the earlier) or with a key in ``held``, in order."""
    keep = [False] * len(endpoints)
    for i in heapq.nsmallest(k, range(len(endpoints)), key=loads.__getitem__):  # as sorted(...)[:k]: stable
        keep[i] = True
    return [e for i, e in enumerate(endpoints) if keep[i] or e.key in held]
