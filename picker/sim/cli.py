"""``picker sim``: run one or many simulated vLLM servers in one process.

    picker sim --preset h100-8b --port 8000
    picker sim --preset cpu --ports 8001,8002,8003
    picker sim --preset fast --count 8 --base-port 9000 --num-gpu-blocks 2000 --duration-s 60

Each port gets its own engine, driver task, fault injector and metrics; all share one event loop (cheap: see
docs/simulator.md for how many fit on a 2-core machine). vLLM flags that make no sense for a simulator
(``--tensor-parallel-size``, ``--gpu-memory-utilization``, ``--enforce-eager``) are accepted and ignored.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable

from picker.sim.config import PRESETS, EngineConfig, preset
from picker.sim.faults import ERROR_TYPES, METRICS_MODES, Faults
from picker.sim.server import ServerConfig, SimServer

__all__ = ["configure", "engine_config", "ports", "run", "serve"]


def configure(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("listening")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in a pod)")
    g.add_argument("--port", type=int, default=8000, help="single port (default 8000)")
    g.add_argument("--ports", help="comma-separated ports, one server each")
    g.add_argument("--count", type=int, help="number of servers on consecutive ports from --base-port")
    g.add_argument("--base-port", type=int, default=8000)
    g.add_argument("--duration-s", type=float, help="exit after this many seconds")
    g.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)

    e = parser.add_argument_group("engine")
    e.add_argument("--preset", choices=sorted(PRESETS), default="h100-8b")
    e.add_argument("--model", help="served base model name (default sim-model)")
    e.add_argument("--served-model-name", dest="model_alias", metavar="NAME", help="alias of --model (vLLM's flag)")
    e.add_argument("--max-num-seqs", type=int)
    e.add_argument("--max-num-batched-tokens", type=int)
    e.add_argument("--num-gpu-blocks", "--kv-cache-size", dest="num_gpu_blocks", type=int)
    e.add_argument("--block-size", type=int)
    e.add_argument("--max-model-len", type=int)
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    e.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    e.add_argument("--lora-modules", help="adapter names, comma-separated (vLLM's name=path form accepted)")
    e.add_argument("--max-loras", type=int)
    e.add_argument("--max-waiting", type=int, help="waiting-queue bound (more is answered 429)")
    e.add_argument("--natural-output-tokens", type=int, help="mean answer length without ignore_eos")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--slowdown", type=float, help="multiply every engine step's time (2.5: a server 2.5x slower)")
    for ignored in ("--tensor-parallel-size", "--gpu-memory-utilization", "--enforce-eager", "--dtype"):
        e.add_argument(ignored, nargs="?", const=True, help=argparse.SUPPRESS)

    f = parser.add_argument_group("failure injection")
    f.add_argument("--failure-rate", type=float, default=0.0, help="probability a request gets an error")
    f.add_argument("--failure-types", default="server_error", help=f"comma-separated: {', '.join(ERROR_TYPES)}")
    f.add_argument("--hang-rate", type=float, default=0.0, help="probability a request hangs")
    f.add_argument("--hang-s", type=float, default=30.0)
    f.add_argument("--spike-rate", type=float, default=0.0, help="probability an engine step stalls")
    f.add_argument("--spike-ms", type=float, default=0.0)
    f.add_argument("--crash-after", type=int, help="crash at every N-th request")
    f.add_argument("--crash-down-s", type=float, help="seconds a crash keeps the port closed (default: forever)")
    f.add_argument("--metrics-delay-s", type=float, default=0.0, help="/metrics answers after this long")
    f.add_argument("--metrics-mode", choices=METRICS_MODES, default="ok", help="garbage or huge /metrics pages")
    f.add_argument("--startup-s", type=float, default=0.0, help="cold start: open the port after this long")

    o = parser.add_argument_group("other")
    o.add_argument("--legacy-metric-names", action="store_true", help="also export vllm:gpu_cache_usage_perc")
    o.add_argument("--log-level", default="WARNING")


def ports(args: argparse.Namespace) -> list[int]:
    if args.ports:
        try:
            out = [int(p) for p in args.ports.split(",") if p.strip()]
        except ValueError:
            raise ValueError(f"--ports must be comma-separated integers, got {args.ports!r}") from None
    elif args.count is not None:
        if args.count < 1:
            raise ValueError("--count must be >= 1")
        out = list(range(args.base_port, args.base_port + args.count))
    else:
        out = [args.port]
    if len(set(out)) != len(out) or any(not 0 <= p < 65536 for p in out):
        raise ValueError(f"ports must be distinct and in [0, 65535]: {out}")
    return out


def engine_config(args: argparse.Namespace) -> EngineConfig:
    changes: dict[str, object] = {}
    model = args.model or args.model_alias
    if model:
        changes["model"] = model
    for name in (
        "max_num_seqs",
        "max_num_batched_tokens",
        "num_gpu_blocks",
        "block_size",
        "max_model_len",
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "max_loras",
        "max_waiting",
        "natural_output_tokens",
        "slowdown",
    ):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    if args.lora_modules:
        changes["lora_adapters"] = tuple(m.split("=", 1)[0].strip() for m in args.lora_modules.split(",") if m)
    changes["seed"] = args.seed
    return preset(args.preset, **changes)


def _faults(args: argparse.Namespace) -> Faults:
    return Faults(
        error_rate=args.failure_rate,
        error_types=tuple(t.strip() for t in args.failure_types.split(",") if t.strip()),
        hang_rate=args.hang_rate,
        hang_s=args.hang_s,
        spike_rate=args.spike_rate,
        spike_s=args.spike_ms / 1000.0,
        crash_after=args.crash_after,
        crash_down_s=args.crash_down_s,
        metrics_delay_s=args.metrics_delay_s,
        metrics_mode=args.metrics_mode,
    )


async def serve(
    config: EngineConfig,
    server_configs: list[ServerConfig],
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[list[SimServer]], None] | None = None,
) -> list[SimServer]:
    """Start one server per config, run until ``stop`` is set or ``duration_s`` passes, stop them all."""
    stop = stop or asyncio.Event()
    servers = [SimServer(config, sc) for sc in server_configs]
    try:
        for server in servers:
            await server.start()
            print(f"picker sim: {server.name} serving {config.model} on {server.url}", flush=True)
        if on_started is not None:
            on_started(servers)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=duration_s)
    finally:
        for server in servers:
            await server.stop()
    return servers


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        port_list = ports(args)
        config = engine_config(args)
        faults = _faults(args)
    except ValueError as exc:
        print(f"picker sim: {exc}", file=sys.stderr)
        return 2
    server_configs = [
        ServerConfig(
            host=args.host,
            port=port,
            max_body_bytes=args.max_body_bytes,
            faults=faults,
            fault_seed=args.seed + i,
            legacy_metric_names=args.legacy_metric_names,
            pod_name=os.environ.get("POD_NAME"),
            pod_namespace=os.environ.get("POD_NAMESPACE"),
            startup_s=args.startup_s,
        )
        for i, port in enumerate(port_list)
    ]

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, server_configs, duration_s=args.duration_s, stop=stop)

    try:
        asyncio.run(main())
    except OSError as exc:
        print(f"picker sim: {exc}", file=sys.stderr)
        return 1
    return 0
