"""``picker bench kv-live``: precise vs approximate vs no prefix affinity, live: real processes, real Envoy.

    picker bench kv-live                                  # the live report in docs/performance.md (~8 min)
    picker bench kv-live --replicas 2 --duration 20       # quicker

For every configuration (docs/examples/kv-events: ``precise``, ``approximate``, ``none``) and every number of
picker replicas: fresh simulated servers (``picker sim`` in one process, ``h100-8b``, publishing KV events on
ZeroMQ from ``--kv-events-port``), ``R`` ``picker serve`` processes with that configuration (the precise one
subscribing to every server and asking their ``/tokenize`` for token ids), and a real Envoy whose ext_proc
cluster holds the ``R`` replicas (each request's stream goes to one of them, round robin). The load client then
sends the shared-prefix workload through Envoy at ``--rate`` for ``--duration`` seconds; the same requests at
the same times in every phase (seeded).

The working set (groups x system prompt) is ``--ratio`` times the servers' KV cache in all. Reported per
phase: TTFT p50/p90/mean, output tokens/s, the cached share of prompt tokens (the servers' own
``cached_tokens``), failures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from picker.bench import envoy, flags, procs
from picker.bench import workloads as wl
from picker.bench.kv_lab import CONFIGS, EXAMPLES
from picker.bench.load import LoadSpec, run_load
from picker.bench.report import Summary, summarize
from picker.scheduling import units

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sims", type=units.at_least(2), default=4, help="simulated servers (default 4)")
    parser.add_argument(
        "--num-gpu-blocks", type=units.at_least(1), default=512, help="KV blocks of 16 tokens per server"
    )
    parser.add_argument("--replicas", default="1,2", help="picker replicas, comma list (default 1,2)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="of precise, approximate, none")
    parser.add_argument("--ratio", type=units.above(0), default=2.0, help="working set ÷ the servers' KV (default 2)")
    parser.add_argument("--system-len", type=units.at_least(1), default=2048)
    parser.add_argument("--question-len", type=units.at_least(1), default=64)
    parser.add_argument("--output-len", type=units.at_least(1), default=32)
    parser.add_argument("--rate", type=units.above(0), default=6.0, help="requests/s (default 6)")
    parser.add_argument("--duration", type=units.above(0), default=60.0, help="seconds of load per phase (default 60)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs-dir", type=Path, default=EXAMPLES)
    parser.add_argument("--json", type=Path)


def _config_text(path: Path, socket_port: int) -> str:
    """The example configuration, with the servers' KV-event port of this run."""
    doc = yaml.safe_load(path.read_text())
    for plugin in doc.get("plugins", []):
        if plugin.get("type") == "precise-prefix-cache-scorer":
            params = plugin.setdefault("parameters", {})
            events = params.setdefault("kvEventsConfig", {})
            events.setdefault("podDiscoveryConfig", {})["socketPort"] = socket_port
    return str(yaml.safe_dump(doc, sort_keys=False))


def _consecutive_free_ports(n: int) -> int:
    import socket

    while True:
        base = procs.free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()


@contextlib.asynccontextmanager
async def _stack(args: argparse.Namespace, config: str, replicas: int) -> AsyncIterator[int]:
    """Servers, ``replicas`` pickers and Envoy; yields the gateway's port."""
    ports = sorted(procs.free_port() for _ in range(args.sims))
    kv_base = _consecutive_free_ports(args.sims)
    async with contextlib.AsyncExitStack() as stack:
        sim_argv = [*procs.picker_command(), "sim", "--preset", "h100-8b", "--ports", ",".join(map(str, ports))]
        sim_argv += ["--num-gpu-blocks", str(args.num_gpu_blocks), "--seed", str(args.seed)]
        sim_argv += ["--kv-events-port", str(kv_base)]
        sims = await stack.enter_async_context(procs.spawn("sims", sim_argv))
        for port in ports:
            await sims.wait_http(f"http://127.0.0.1:{port}/health", 30.0)
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="picker-kv-live-"))
        config_path = Path(tmp) / "config.yaml"
        config_path.write_text(_config_text(args.configs_dir / f"{config}.yaml", kv_base))
        grpc_ports = []
        for r in range(replicas):
            grpc, health, metrics = procs.free_port(), procs.free_port(), procs.free_port()
            argv = [*procs.picker_command(), "serve", "--endpoints", ",".join(f"127.0.0.1:{p}" for p in ports)]
            argv += ["--host", "127.0.0.1", "--grpc-port", str(grpc), "--grpc-health-port", str(health)]
            argv += ["--metrics-port", str(metrics), "--refresh-metrics-interval", "50ms", "--config-file"]
            argv += [str(config_path), "--grace-period", "0s", "--termination-grace", "2s", "--log-level", "warning"]
            child = await stack.enter_async_context(procs.spawn(f"picker-{r}", argv))
            await child.wait_http(f"http://127.0.0.1:{metrics}/metrics", 30.0)
            grpc_ports.append(grpc)
        await asyncio.sleep(0.5)  # scrapes and KV-event subscriptions are up
        listen, admin = procs.free_port(), procs.free_port()
        bootstrap = envoy.render(
            listen_port=listen,
            admin_port=admin,
            picker_port=grpc_ports[0],
            extra_picker_ports=grpc_ports[1:],
            backends=[("127.0.0.1", p) for p in ports],
            body_mode="FULL_DUPLEX_STREAMED",
            picker_tls=True,
        )
        await stack.enter_async_context(envoy.run_envoy(bootstrap, admin, binary=envoy.envoy_binary()))
        yield listen


async def _phase(args: argparse.Namespace, config: str, replicas: int) -> Summary:
    fleet = args.sims * args.num_gpu_blocks * 16
    groups = max(1, round(args.ratio * fleet / args.system_len))
    workload = wl.shared_prefix(
        num_groups=groups,
        prompts_per_group=8,
        system_prompt_len=args.system_len,
        question_len=args.question_len,
        output_len=args.output_len,
        seed=args.seed,
    )
    spec = LoadSpec(
        rate=args.rate,
        max_requests=100_000,
        max_duration_s=args.duration,
        drain_s=30.0,
        timeout_s=60.0,
        seed=args.seed,
    )
    async with _stack(args, config, replicas) as port:
        result = await run_load(f"http://127.0.0.1:{port}", workload, spec)
    return summarize(result)


def run(args: argparse.Namespace) -> int:
    try:
        replica_counts = flags.numbers(args.replicas, "--replicas", int, least=1)
        configs = flags.names(args.configs)
        if not configs or not set(configs) <= set(CONFIGS):
            raise ValueError(f"configs among {', '.join(CONFIGS)}")
        envoy.envoy_binary()
    except (ValueError, envoy.EnvoyNotFound) as exc:
        print(f"picker bench kv-live: {exc}", file=sys.stderr)
        return 2
    fleet = args.sims * args.num_gpu_blocks * 16
    print(
        f"kv-live: {args.sims} simulated h100-8b servers ({fleet:,} KV tokens in all), working set {args.ratio:g}x, "
        f"shared prefix {args.system_len}+{args.question_len} -> {args.output_len} tokens, {args.rate:g} req/s for "
        f"{args.duration:g} s per phase, through Envoy",
        flush=True,
    )
    head = f"{'replicas':>8} {'config':<12} {'TTFT p50':>9} {'p90':>8} {'mean':>8} {'out tok/s':>9} {'cached':>7}"
    print(f"{head} {'ok':>5} {'failed':>6}")
    rows: list[dict[str, Any]] = []
    started = time.perf_counter()
    for replicas in replica_counts:
        for config in configs:
            try:
                s = asyncio.run(_phase(args, config, replicas))
            except procs.ChildFailed as exc:
                print(f"picker bench kv-live: {config} x{replicas}: {exc}", file=sys.stderr)
                return 1
            print(
                f"{replicas:>8} {config:<12} {s.ttft_s.p50:>8.3f}s {s.ttft_s.p90:>7.3f}s {s.ttft_s.mean:>7.3f}s "
                f"{s.output_tok_s:>9.0f} {s.cached_share:>7.1%} {s.ok:>5} {s.failed:>6}",
                flush=True,
            )
            rows.append({"replicas": replicas, "config": config, "summary": s, "cached_share": s.cached_share})
    print(f"kv-live: {len(rows)} phases in {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_bytes(
            orjson.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_DATACLASS,
            )
        )
        print(f"wrote {args.json}")
    return 0
