"""``picker sim``: run one or many simulated vLLM servers in one process.

    picker sim --preset h100-8b --port 8000
    picker sim --preset cpu --ports 8001,8002,8003
    picker sim --preset fast --count 8 --base-port 9000 --num-gpu-blocks 2000 --duration-s 60
    picker sim --preset fast --count 4 --base-port 9000 --kv-events-port 5557      # KV events, per-pod PUB
    picker sim --preset fast --count 4 --zmq-endpoint tcp://127.0.0.1:5557         # ... dialling picker
    picker sim --ports 9001,9002,9003 --sidecar-ports 0,0,9103 --prefillers 127.0.0.1:9001,127.0.0.1:9002
    picker sim --hosts 127.0.0.2,127.0.0.3 --port 8000                           # one server per address (pod IPs)

Every server plays both P/D roles, by request (``kv_transfer_params``); ``--sidecar-ports`` puts llm-d's routing
sidecar (``sidecar.py``) in front of the servers that decode: a request to port 9103 naming a prefiller in
``x-prefiller-host-port`` is prefilled there first, then decoded on 9003 with its KV pulled over the link
(``--kv-link-gbps``, ``--kv-bytes-per-token``, or ``--kv-cache-transfer-time-per-token``).

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

from picker.scheduling import units
from picker.scheduling.units import port_arg
from picker.sim.config import DEFAULT_LINK_GBPS, KV_BYTES_PER_TOKEN_8B, PRESETS, EngineConfig, link_s_per_token, preset
from picker.sim.faults import ERROR_TYPES, METRICS_MODES, Faults
from picker.sim.server import KVEventsOptions, ServerConfig, SimServer
from picker.sim.sidecar import RoutingSidecar, SidecarConfig

__all__ = ["configure", "engine_config", "hosts", "kv_events", "ports", "run", "serve", "sidecar_configs"]


def configure(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("listening")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 in a pod)")
    g.add_argument("--port", type=port_arg, default=8000, help="single port (default 8000)")
    g.add_argument("--ports", help="comma-separated ports, one server each")
    g.add_argument("--count", type=int, help="number of servers on consecutive ports from --base-port")
    g.add_argument(
        "--hosts",
        help="comma-separated addresses, one server each on --port, named sim-<host>:<port> (like pods sharing a "
        "container port; picker demo --kube)",
    )
    g.add_argument("--base-port", type=port_arg, default=8000)
    g.add_argument("--duration-s", type=units.above(0), help="exit after this many seconds")
    g.add_argument("--max-body-bytes", type=units.at_least(1), default=8 * 1024 * 1024)

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

    d = parser.add_argument_group("prefill/decode disaggregation")
    d.add_argument(
        "--sidecar-ports",
        help="comma-separated, one per --ports entry: a routing sidecar on that port in front of the server (0: none)",
    )
    d.add_argument("--prefillers", help="host:port list the sidecars may send prefills to (their SSRF allowlist)")
    d.add_argument("--allow-any-prefiller", action="store_true", help="no allowlist (local tries only)")
    d.add_argument("--kv-link-gbps", type=float, help=f"KV transfer link, Gb/s (default {DEFAULT_LINK_GBPS:g})")
    d.add_argument(
        "--kv-bytes-per-token",
        type=units.at_least(1),
        help=f"KV cache bytes per token (default {KV_BYTES_PER_TOKEN_8B}: 8B model)",
    )
    d.add_argument(
        "--kv-cache-transfer-time-per-token",
        type=float,
        metavar="MS",
        help="KV transfer time per token in ms (llm-d-inference-sim's flag; overrides the link and bytes)",
    )

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
    f.add_argument(
        "--startup-s", type=units.at_least(0.0, float), default=0.0, help="cold start: open the port after this long"
    )

    k = parser.add_argument_group("KV-cache events (vLLM's ZeroMQ wire)")
    k.add_argument("--kv-events-port", type=port_arg, help="bind a PUB socket here (server i: port + i; 0: any)")
    k.add_argument("--zmq-endpoint", help="dial this SUB socket instead (picker's central mode), e.g. tcp://h:5557")
    k.add_argument(
        "--kv-events-replay-port", type=port_arg, help="serve replays on a ROUTER socket (server i: port + i)"
    )
    k.add_argument(
        "--event-batch-size", type=units.at_least(1), default=16, help="events per published batch (default 16)"
    )
    k.add_argument("--use-vllm-map-event-format", action="store_true", help="events as maps, not arrays")
    k.add_argument("--hash-seed", type=int, help="block-hash seed (vLLM's PYTHONHASHSEED; default 0)")

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


def hosts(args: argparse.Namespace, port_list: list[int]) -> list[str]:
    """The address of each server: ``--host`` for every port, or with ``--hosts`` one server per address, all on
    the one port (``port_list`` is then repeated by the caller)."""
    if not args.hosts:
        return [args.host] * len(port_list)
    out = [h.strip() for h in args.hosts.split(",") if h.strip()]
    if not out or len(set(out)) != len(out):
        raise ValueError(f"--hosts must be distinct addresses, got {args.hosts!r}")
    if len(port_list) != 1 or args.sidecar_ports:
        raise ValueError("--hosts runs one server per address on one --port (not with --ports, --count or sidecars)")
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
        "hash_seed",
    ):
        value = getattr(args, name)
        if value is not None:
            changes[name] = value
    if args.kv_cache_transfer_time_per_token is not None:
        if args.kv_cache_transfer_time_per_token < 0:
            raise ValueError("--kv-cache-transfer-time-per-token must be >= 0")
        changes["kv_transfer_s_per_token"] = args.kv_cache_transfer_time_per_token / 1000.0
    elif args.kv_link_gbps is not None or args.kv_bytes_per_token is not None:
        gbps = args.kv_link_gbps if args.kv_link_gbps is not None else DEFAULT_LINK_GBPS
        per_token = args.kv_bytes_per_token if args.kv_bytes_per_token is not None else KV_BYTES_PER_TOKEN_8B
        changes["kv_transfer_s_per_token"] = link_s_per_token(per_token, gbps)
    if args.lora_modules:
        changes["lora_adapters"] = tuple(m.split("=", 1)[0].strip() for m in args.lora_modules.split(",") if m)
    changes["seed"] = args.seed
    return preset(args.preset, **changes)


def kv_events(args: argparse.Namespace, i: int) -> KVEventsOptions | None:
    """Server ``i``'s KV-event options, or None when neither --kv-events-port nor --zmq-endpoint is given."""
    if args.kv_events_port is None and args.zmq_endpoint is None:
        if args.kv_events_replay_port is not None:
            raise ValueError("--kv-events-replay-port needs --kv-events-port or --zmq-endpoint")
        return None
    if args.kv_events_port is not None and args.zmq_endpoint is not None:
        raise ValueError("give --kv-events-port or --zmq-endpoint, not both")
    if args.event_batch_size < 1:
        raise ValueError("--event-batch-size must be >= 1")

    def nth(port: int | None) -> int | None:
        return None if port is None else (port + i if port else 0)

    host = os.environ.get("POD_IP") or (args.host if args.host not in ("0.0.0.0", "::") else "127.0.0.1")
    return KVEventsOptions(
        port=nth(args.kv_events_port),
        zmq_endpoint=args.zmq_endpoint,
        replay_port=nth(args.kv_events_replay_port),
        topic_host=host,
        batch_size=args.event_batch_size,
        map_format=args.use_vllm_map_event_format,
    )


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


def sidecar_configs(args: argparse.Namespace, port_list: list[int]) -> list[SidecarConfig]:
    """The sidecars ``--sidecar-ports`` asks for, each in front of the server on the same position's port."""
    if not args.sidecar_ports:
        return []
    try:
        sidecar_ports = [int(p) for p in args.sidecar_ports.split(",")]
    except ValueError:
        raise ValueError(f"--sidecar-ports must be comma-separated integers, got {args.sidecar_ports!r}") from None
    if len(sidecar_ports) != len(port_list):
        raise ValueError(f"--sidecar-ports needs one entry per server port ({len(port_list)}), 0 for none")
    used = [p for p in sidecar_ports if p]
    if len(set(used)) != len(used) or set(used) & set(port_list) or any(not 0 <= p < 65536 for p in used):
        raise ValueError(f"sidecar ports must be distinct, in [1, 65535] and not server ports: {used}")
    if args.allow_any_prefiller:
        allowed: frozenset[str] | None = None
    else:
        allowed = frozenset(p.strip() for p in (args.prefillers or "").split(",") if p.strip())
        if not allowed:
            raise ValueError("sidecars need --prefillers (the host:port they may send prefills to)")
    host = args.host if args.host not in ("0.0.0.0", "::") else "127.0.0.1"
    return [
        SidecarConfig(
            decoder_url=f"http://{host}:{server_port}",
            host=args.host,
            port=sidecar_port,
            allowed_prefillers=allowed,
            max_body_bytes=args.max_body_bytes,
        )
        for server_port, sidecar_port in zip(port_list, sidecar_ports, strict=True)
        if sidecar_port
    ]


async def serve(
    config: EngineConfig,
    server_configs: list[ServerConfig],
    *,
    duration_s: float | None = None,
    stop: asyncio.Event | None = None,
    on_started: Callable[[list[SimServer]], None] | None = None,
    sidecars: list[SidecarConfig] | None = None,
) -> list[SimServer]:
    """Start one server per config (and the sidecars), run until ``stop`` is set or ``duration_s`` passes, stop
    them all."""
    stop = stop or asyncio.Event()
    servers = [SimServer(config, sc) for sc in server_configs]
    proxies = [RoutingSidecar(c) for c in sidecars or ()]
    try:
        for server in servers:
            await server.start()
            print(f"picker sim: {server.name} serving {config.model} on {server.url}", flush=True)
            if server.kv_publisher is not None and server.kv_publisher.port is not None:
                print(f"picker sim: {server.name} KV events on tcp port {server.kv_publisher.port}", flush=True)
        for proxy in proxies:
            await proxy.start()
            print(f"picker sim: routing sidecar on {proxy.url} in front of {proxy.config.decoder_url}", flush=True)
        if on_started is not None:
            on_started(servers)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=duration_s)
    finally:
        for proxy in proxies:
            await proxy.stop()
        for server in servers:
            await server.stop()
    return servers


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        port_list = ports(args)
        host_list = hosts(args, port_list)
        port_list = port_list * len(host_list) if args.hosts else port_list
        config = engine_config(args)
        faults = _faults(args)
        kv = [kv_events(args, i) for i in range(len(port_list))]
        sidecars = sidecar_configs(args, port_list)
    except ValueError as exc:
        print(f"picker sim: {exc}", file=sys.stderr)
        return 2
    server_configs = [
        ServerConfig(
            host=host_list[i],
            port=port,
            name=f"sim-{host_list[i]}:{port}" if args.hosts else None,
            max_body_bytes=args.max_body_bytes,
            faults=faults,
            fault_seed=args.seed + i,
            legacy_metric_names=args.legacy_metric_names,
            pod_name=os.environ.get("POD_NAME"),
            pod_namespace=os.environ.get("POD_NAMESPACE"),
            kv_events=kv[i],
            startup_s=args.startup_s,
        )
        for i, port in enumerate(port_list)
    ]

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve(config, server_configs, duration_s=args.duration_s, stop=stop, sidecars=sidecars)

    try:
        asyncio.run(main())
    except OSError as exc:
        print(f"picker sim: {exc}", file=sys.stderr)
        return 1
    return 0
