"""picker's own count of what each endpoint is working on: the only per-request mutable state.

Scraped numbers are up to one interval old; these are exact. A ``Lease`` is taken when a request is routed and
released when its response completes, its stream ends, or a timeout passes (gateways that send no response
phases). Release is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["DEFAULT_DECODE_TOKENS", "DEFAULT_REQUEST_TOKENS", "EndpointLoad", "InflightTracker", "Lease"]

_EWMA_ALPHA = 0.2
_SIZE_ALPHA = 0.05  # request sizes: a slower average, over the last ~20 requests
# What an average request weighs before picker has routed any: a prompt plus an answer, and the answer alone.
DEFAULT_REQUEST_TOKENS = 1024.0
DEFAULT_DECODE_TOKENS = 256.0


class HasKey(Protocol):
    @property
    def key(self) -> str: ...


@dataclass(slots=True)
class EndpointLoad:
    requests: int = 0
    tokens: int = 0  # prompt tokens not yet prefilled + expected output tokens
    ttft_s: float | None = None  # EWMA of observed time to first token
    tpot_s: float | None = None  # EWMA of observed time per output token
    prefilling: int = 0  # requests routed here whose first token has not arrived yet


@dataclass(slots=True, eq=False)
class Lease:
    """One routed request picker has not seen finish. What the server model (``latency-scorer``) reads of it: the
    prompt tokens the server must prefill, the expected answer and whether its length is fixed, its first token."""

    endpoint_key: str
    tokens: int
    started_at: float
    released: bool = field(default=False)
    prefilling: bool = field(default=True)  # no first token yet
    prefill_tokens: int = 0  # the prompt tokens the server must compute (uncached, as estimated when routed)
    max_output_tokens: int = 0  # the request's max_tokens (the exact answer length when ``fixed_output``); 0: none
    fixed_output: bool = False
    model: str = ""
    first_token_at: float | None = None


_ZERO = EndpointLoad()  # what ``load`` returns for an endpoint never seen; never mutated


class InflightTracker:
    def __init__(self) -> None:
        self._loads: dict[str, EndpointLoad] = {}
        # Open leases per endpoint, oldest first (a dict keeps insertion order and removes in O(1)).
        self._open: dict[str, dict[int, Lease]] = {}
        self.open_leases = 0  # acquired and not yet released, over every endpoint (also ones that left the pool)
        # Moving averages of a routed request's tokens when it is sent (prompt + expected output) and once its
        # prompt is prefilled (expected output): the weight of a request picker knows only as a count.
        self.request_tokens = DEFAULT_REQUEST_TOKENS
        self.decode_tokens = DEFAULT_DECODE_TOKENS
        self._sized = self._decoded = False
        # Told the key of every endpoint whose load changed: the pool's table (``PeerLoads.attach``) and the
        # peer exchange's list of what to report (``Exchange``).
        self._listeners: list[Callable[[str], None]] = []

    def listen(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(key)`` after every change of an endpoint's load (on the caller's thread)."""
        self._listeners.append(listener)

    def unlisten(self, listener: Callable[[str], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _changed(self, key: str) -> None:
        for listener in self._listeners:
            listener(key)

    def acquire(
        self,
        endpoint_key: str,
        tokens: int,
        now: float,
        *,
        prefill_tokens: int = 0,
        max_output_tokens: int = 0,
        fixed_output: bool = False,
        model: str = "",
    ) -> Lease:
        """Count a request routed to ``endpoint_key``: ``tokens`` = prompt + expected output (the load scorers'
        unit); the keyword terms are what the server model reads of each request (``Lease``)."""
        load = self._loads.setdefault(endpoint_key, EndpointLoad())
        load.requests += 1
        load.tokens += tokens
        load.prefilling += 1
        self.open_leases += 1
        if self._sized:
            self.request_tokens += _SIZE_ALPHA * (tokens - self.request_tokens)
        else:
            self.request_tokens, self._sized = float(tokens), True
        lease = Lease(
            endpoint_key,
            tokens,
            now,
            prefill_tokens=prefill_tokens,
            max_output_tokens=max_output_tokens,
            fixed_output=fixed_output,
            model=model,
        )
        self._open.setdefault(endpoint_key, {})[id(lease)] = lease
        if self._listeners:
            self._changed(endpoint_key)
        return lease

    def release(self, lease: Lease) -> bool:
        """Give back a lease's requests and tokens. Returns False if it was already released."""
        if lease.released:
            return False
        lease.released = True
        self.open_leases -= 1
        open_here = self._open.get(lease.endpoint_key)
        if open_here is not None:
            open_here.pop(id(lease), None)
            if not open_here:
                del self._open[lease.endpoint_key]
        load = self._loads.get(lease.endpoint_key)
        if load is not None:
            load.requests = max(0, load.requests - 1)
            load.tokens = max(0, load.tokens - lease.tokens)
            if lease.prefilling:
                load.prefilling = max(0, load.prefilling - 1)
            if self._listeners:
                self._changed(lease.endpoint_key)
        lease.prefilling = False
        return True

    def prefilled(self, lease: Lease, prompt_tokens: int, now: float | None = None) -> None:
        """The first token arrived (at ``now``; unknown: the lease's start): the prompt part of a lease's tokens is
        no longer pending work."""
        if lease.released:
            return
        if lease.prefilling:
            lease.first_token_at = lease.started_at if now is None else now
        done = min(prompt_tokens, lease.tokens)
        lease.tokens -= done
        load = self._loads.get(lease.endpoint_key)
        if load is not None:
            load.tokens = max(0, load.tokens - done)
            if lease.prefilling:
                load.prefilling = max(0, load.prefilling - 1)
            if self._listeners:
                self._changed(lease.endpoint_key)
        lease.prefilling = False
        if self._decoded:
            self.decode_tokens += _SIZE_ALPHA * (lease.tokens - self.decode_tokens)
        else:
            self.decode_tokens, self._decoded = float(lease.tokens), True

    def observe(self, endpoint_key: str, *, ttft_s: float | None = None, tpot_s: float | None = None) -> None:
        load = self._loads.setdefault(endpoint_key, EndpointLoad())
        if ttft_s is not None:
            load.ttft_s = ttft_s if load.ttft_s is None else load.ttft_s + _EWMA_ALPHA * (ttft_s - load.ttft_s)
        if tpot_s is not None:
            load.tpot_s = tpot_s if load.tpot_s is None else load.tpot_s + _EWMA_ALPHA * (tpot_s - load.tpot_s)
        if self._listeners:
            self._changed(endpoint_key)

    def load(self, endpoint_key: str) -> EndpointLoad:
        """The current load (a zero load for an endpoint never seen). Do not mutate the result."""
        return self._loads.get(endpoint_key) or _ZERO

    def loads(self) -> Mapping[str, EndpointLoad]:
        """Endpoint key → its load, for every endpoint with state (the native pre-filter reads it). Read only."""
        return self._loads

    def leases(self, endpoint_key: str) -> Collection[Lease]:
        """picker's open leases on ``endpoint_key``, oldest first. Read only."""
        open_here = self._open.get(endpoint_key)
        return open_here.values() if open_here is not None else ()

    def requests(self, endpoint_key: str) -> int:
        load = self._loads.get(endpoint_key)
        return load.requests if load else 0

    def tokens(self, endpoint_key: str) -> int:
        load = self._loads.get(endpoint_key)
        return load.tokens if load else 0

    def tokens_of(self, endpoints: Iterable[HasKey]) -> list[int]:
        """In-flight tokens of each endpoint, in order (the hot loop of load scorers)."""
        loads = self._loads
        return [load.tokens if (load := loads.get(e.key)) is not None else 0 for e in endpoints]

    def prefilling_of(self, endpoints: Iterable[HasKey]) -> list[int]:
        """Requests waiting for their first token on each endpoint, in order."""
        loads = self._loads
        return [load.prefilling if (load := loads.get(e.key)) is not None else 0 for e in endpoints]

    def forget_except(self, keys: Iterable[str]) -> None:
        """Drop state of endpoints that left the pool."""
        keep = set(keys)
        for key in [k for k in self._open if k not in keep]:
            del self._open[key]
        for key in [k for k in self._loads if k not in keep]:
            del self._loads[key]
            if self._listeners:
                self._changed(key)
