"""Which native hot path is in use: ``picker.scheduling._native`` (a small C extension) or none.

``scripts/install.sh`` builds the extension from ``picker/scheduling/_native.c`` (setup.py; optional: without a C
compiler the install goes on). Every native function has a pure-Python twin that defines its result and is used
when the extension is missing or ``PICKER_NATIVE=0``; tests check both equal on randomized inputs
(tests/scheduling/plugins/test_native.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from types import ModuleType

from picker.endpoints.inflight import EndpointLoad
from picker.endpoints.model import Endpoint
from picker.scheduling.framework import PluginContext

__all__ = [
    "NATIVE",
    "load",
    "module",
    "server_foreign",
    "server_requests",
    "server_tokens",
    "server_waiting",
    "token_load_args",
]


def load() -> ModuleType | None:
    """The extension, or None when it is not built or ``PICKER_NATIVE`` is ``0``."""
    if os.environ.get("PICKER_NATIVE", "1") == "0":
        return None
    try:
        from picker.scheduling import _native
    except ImportError:  # not built (no compiler at install): the pure-Python twins
        return None
    return _native


module = load()
_REQUESTS, _WAITING, _FOREIGN = 1, 2, 3  # tokens_of's modes: serverload.requests_of, waiting_of, foreign_of
NATIVE = module is not None  # whether the C extension is in use


def token_load_args(ctx: PluginContext) -> tuple[Mapping[str, EndpointLoad], float, float, float, float]:
    """What the C token estimate reads besides the endpoints: (ledger, now, request_tokens, decode_tokens,
    max_age_s), as ``ctx.server_tokens`` reads them."""
    inflight = ctx.inflight
    return ctx.ledger_loads(), ctx.clock(), inflight.request_tokens, inflight.decode_tokens, ctx.metrics_max_age_s


def server_tokens(ctx: PluginContext, endpoints: Sequence[Endpoint]) -> list[float]:
    """``ctx.server_tokens(endpoints)``, in C when the extension is in use."""
    fast = module
    if fast is not None:
        found: list[float] | None = fast.tokens_of(endpoints, *token_load_args(ctx))
        if found is not None:
            return found
    return ctx.server_tokens(endpoints)


def server_requests(ctx: PluginContext, endpoints: Sequence[Endpoint]) -> list[float]:
    """``ctx.server_requests(endpoints)``, in C when the extension is in use."""
    found = _counts(ctx, endpoints, _REQUESTS)
    return found if found is not None else ctx.server_requests(endpoints)


def server_waiting(ctx: PluginContext, endpoints: Sequence[Endpoint]) -> list[float]:
    """``ctx.server_waiting(endpoints)``, in C when the extension is in use."""
    found = _counts(ctx, endpoints, _WAITING)
    return found if found is not None else ctx.server_waiting(endpoints)


def server_foreign(ctx: PluginContext, endpoints: Sequence[Endpoint]) -> list[float]:
    """``ctx.server_foreign(endpoints)``, in C when the extension is in use."""
    found = _counts(ctx, endpoints, _FOREIGN)
    return found if found is not None else ctx.server_foreign(endpoints)


def _counts(ctx: PluginContext, endpoints: Sequence[Endpoint], mode: int) -> list[float] | None:
    """The C request counts of ``mode`` (no token weights), or None: no extension, or values it declines."""
    fast = module
    if fast is None:
        return None
    found: list[float] | None = fast.tokens_of(
        endpoints, ctx.ledger_loads(), ctx.clock(), 0.0, 0.0, ctx.metrics_max_age_s, mode
    )
    return found
