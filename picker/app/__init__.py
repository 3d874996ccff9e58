"""Picker's composition root and ``picker serve``, one module per concern.

``root``: ``serving`` wires picker together and stops it gracefully; ``process``: ``serve`` runs it as a process
until SIGTERM; ``flags``: the command line → ``Settings``; ``listen``: the ext_proc port's TLS and front;
``precise``: the KV-event path of a precise prefix scorer; ``supervise``: the background tasks' guards;
``metrics_http``: ``/metrics``.

In process (tests, benchmarks)::

    async with serving(settings, store=store) as running:
        ...  # running.grpc_port, running.health_port, running.certificate, running.director, ...

As a process: ``picker serve --endpoints 10.0.0.1:8000,10.0.0.2:8000 [flags]`` (flags as the reference EPP's,
plus picker's; ``picker serve --help``; ``picker.serve`` runs this once, or N times with ``--workers``).
"""

from __future__ import annotations

from picker.app.flags import configure, load, parse_duration, settings_from_args
from picker.app.metrics_http import metrics_authorizer, start_metrics
from picker.app.process import run_settings, serve
from picker.app.root import Running, serving

__all__ = [
    "Running",
    "configure",
    "load",
    "metrics_authorizer",
    "parse_duration",
    "run_settings",
    "serve",
    "serving",
    "settings_from_args",
    "start_metrics",
]
