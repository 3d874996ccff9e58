"""The reference EPP's flags that have no home elsewhere in ``picker serve``, each with what it does here.

The reference (GIE ``cmd/epp/runner/options.go`` plus controller-runtime's zap flags) has flags picker implements,
flags that mean nothing for picker, and flags that ask for something picker does not do. All of them are
*accepted* so a Deployment moving from the reference chart starts; what each one does is its help text, the
table in docs/configuration.md, and — when a given value can't be honoured — a warning at start.
``--enable-cert-reload`` and ``--metrics-endpoint-auth`` are picker's own flags (``app.configure``): implemented,
see extproc/tls.py and discovery/tokenreview.py.

| flag | here |
|---|---|
| ``--tracing`` | OpenTelemetry tracing (telemetry/tracing.py); default **false** (reference: true, see the doc) |
| ``--enable-pprof`` | Python profiling under ``/debug/pprof/`` on the metrics port (telemetry/pprof.py) |
| ``--health-checking`` | the gRPC health service also on the ext_proc port (Envoy's cluster health check); default
  **true** here (reference: false): ``--health-checking=false`` leaves it on the health port only |
| ``--zap-log-level`` | the log level (``debug``, ``info``, ``error``, or a number as ``--v``) |
| ``--zap-devel``, ``--zap-stacktrace-level``, ``--zap-time-encoding`` | accepted, no effect (log format fixed) |
| ``--refresh-prometheus-metrics-interval`` | accepted, no effect: pool gauges are computed at each scrape |
| ``--model-server-metrics-{scheme,path,port,https-insecure-skip-verify}`` | accepted; a non-default value warns |
| ``--total-queued-requests-metric`` and the other per-metric names | accepted; a non-vLLM name warns (see below) |

picker reads an engine's metric names from the ``core-metrics-extractor`` ``defaultEngine`` parameter (vllm,
sglang, trtllm, triton); the per-metric flags that the reference chart renders for sglang/triton/trtllm name
exactly those engines' metrics, so the warning says which ``defaultEngine`` to set instead.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "HEALTH_CHECKING_DEFAULT",
    "METRIC_FLAGS",
    "ReferenceOptions",
    "configure",
    "options_from_args",
    "parse_bool",
    "unhonoured",
]

# The reference's defaults of the per-metric-name flags (vLLM's names).
METRIC_FLAGS: dict[str, str] = {
    "total-queued-requests-metric": "vllm:num_requests_waiting",
    "total-running-requests-metric": "vllm:num_requests_running",
    "kv-cache-usage-percentage-metric": "vllm:kv_cache_usage_perc",
    "lora-info-metric": "vllm:lora_requests_info",
    "cache-info-metric": "vllm:cache_config_info",
}
# --health-checking: on unless turned off (the reference's default is off; picker serves health on the ext_proc port
# so that a gateway can health-check the port it calls: docs/reliability.md).
HEALTH_CHECKING_DEFAULT = True
# Which engine a metric-name prefix belongs to, for the warning's advice.
_ENGINE_OF_PREFIX = {"sglang:": "sglang", "nv_trt_llm_": "triton", "trtllm_": "trtllm", "vllm:": "vllm"}


@dataclass(frozen=True, slots=True)
class ReferenceOptions:
    tracing: bool = False
    enable_pprof: bool = False
    health_checking: bool = True  # HEALTH_CHECKING_DEFAULT
    log_level: str | None = None  # from --zap-log-level


def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on", "t"):
        return True
    if value in ("false", "0", "no", "off", "f"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _metric_name(text: str) -> str:
    # The reference chart renders --total-queued-requests-metric="sglang:num_queue_reqs": the quotes reach the
    # process (no shell in between); the Go flag keeps them too. Strip them to compare names.
    return text.strip().strip('"')


def configure(parser: argparse.ArgumentParser, duration: Callable[[str], float]) -> None:
    """Add the reference-compatibility flags to ``picker serve``'s parser, in their own group."""
    group = parser.add_argument_group("reference EPP flags (accepted for compatibility)")
    add = group.add_argument

    def flag_bool(name: str, default: bool, help_text: str) -> None:
        add(name, type=parse_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help_text)

    flag_bool("--tracing", False, "OpenTelemetry traces over OTLP/gRPC, configured by OTEL_* (reference default: true)")
    flag_bool(
        "--enable-pprof",
        False,
        "Python profiles at /debug/pprof/ on the metrics port: stacks, cProfile, heap (reference default: true)",
    )
    flag_bool(
        "--health-checking",
        HEALTH_CHECKING_DEFAULT,
        "serve the gRPC health service on the ext_proc port too (default true; reference default: false)",
    )
    add(
        "--zap-log-level",
        type=_zap_level,
        default=None,
        help="log level: debug, info, error, or a verbosity number as --v",
    )
    flag_bool("--zap-devel", False, "accepted; no effect (the log format is --zap-encoder)")
    add("--zap-stacktrace-level", default=None, help="accepted; no effect (exceptions always carry their stack)")
    add("--zap-time-encoding", default=None, help="accepted; no effect (timestamps are RFC 3339 UTC)")
    add(
        "--refresh-prometheus-metrics-interval",
        type=duration,
        default=5.0,
        metavar="DURATION",
        help="accepted; no effect: picker computes its pool gauges at each /metrics scrape",
    )
    add("--model-server-metrics-scheme", default="http", help="accepted; only http is scraped (other values warn)")
    add("--model-server-metrics-path", default="/metrics", help="accepted; only /metrics is scraped (others warn)")
    add(
        "--model-server-metrics-port",
        type=int,
        default=0,
        help="accepted (deprecated in the reference); metrics are read on each endpoint's port (others warn)",
    )
    flag_bool("--model-server-metrics-https-insecure-skip-verify", True, "accepted; no effect (no https scraping)")
    for name, default in METRIC_FLAGS.items():
        add(
            f"--{name}",
            type=_metric_name,
            default=default,
            help="accepted; metric names come from the engine (core-metrics-extractor defaultEngine)",
        )


def options_from_args(args: argparse.Namespace) -> ReferenceOptions:
    """The reference flags that act here."""
    return ReferenceOptions(
        tracing=args.tracing,
        enable_pprof=args.enable_pprof,
        health_checking=args.health_checking,
        log_level=args.zap_log_level,
    )


def unhonoured(args: argparse.Namespace) -> list[str]:
    """A warning for each given value picker can't honour (``picker serve`` logs them at start)."""
    out: list[str] = []
    if args.model_server_metrics_scheme != "http":
        out.append(f"--model-server-metrics-scheme={args.model_server_metrics_scheme}: picker scrapes over http only")
    if args.model_server_metrics_path != "/metrics":
        out.append(f"--model-server-metrics-path={args.model_server_metrics_path}: picker scrapes /metrics")
    if args.model_server_metrics_port:
        out.append(
            f"--model-server-metrics-port={args.model_server_metrics_port}: picker scrapes each endpoint's own port"
        )
    engines: set[str] = set()
    for name, default in METRIC_FLAGS.items():
        value = getattr(args, name.replace("-", "_"))
        if value != default:
            engines.add(next((e for p, e in _ENGINE_OF_PREFIX.items() if value.startswith(p)), "?"))
    if engines:
        advice = ", ".join(sorted(e for e in engines if e != "?")) or "the engine's name"
        out.append(
            "per-metric-name flags have no effect: picker reads metric names by engine; set the "
            f"core-metrics-extractor parameter defaultEngine ({advice}) in the plugins config"
        )
    return out


def _zap_level(text: str) -> str:
    """zap's level names, or a number (controller-runtime: verbosity, higher = more)."""
    value = text.strip().lower()
    if value in ("debug", "info", "error"):
        return value
    if value in ("warn", "warning"):
        return "warning"
    if value in ("dpanic", "panic", "fatal"):
        return "error"
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--zap-log-level {text!r}: debug, info, error or a number") from None
    return "debug" if number >= 4 else "info"
