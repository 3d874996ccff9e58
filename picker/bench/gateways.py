"""``picker bench gateways``: what each gateway's data path with picker costs per request, end to end.

For each gateway (Envoy from PyPI; NGINX Gateway Fabric's path: nginx + njs + the shim, picker/bench/ngf.py) two
phases run on fresh simulated servers, the gateway alone (Envoy's round robin; the pool's nginx upstream) and the
gateway with picker as its EndpointPicker, under a light load of distinct short prompts: servers stay idle, so
where a request goes hardly matters and the TTFT difference between the two phases is the cost of the picker path
(for NGF: njs, the shim's new gRPC connection per request, TLS, picker's decision).

    picker bench gateways                      # ~2 minutes: 4 phases of 15 s at 4 req/s
    picker bench gateways --gateways ngf --duration 30 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import orjson

from picker.bench import demo, envoy, flags, lab_report, ngf, procs
from picker.bench import workloads as wl
from picker.scheduling import units

__all__ = ["configure", "run"]

_PHASES = {"envoy": (demo.RR, demo.PICKER), "ngf": (demo.NGF_POOL, demo.NGF_PICKER)}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gateways", default="envoy,ngf", help="comma list of envoy, ngf (default both)")
    parser.add_argument("--sims", type=units.at_least(1), default=2, help="simulated servers (default 2)")
    parser.add_argument("--rate", type=units.above(0), default=4.0, help="requests/s (default 4)")
    parser.add_argument("--duration", type=units.above(0), default=15.0, help="seconds of load per phase (default 15)")
    parser.add_argument("--prompt-len", type=units.at_least(1), default=64, help="prompt tokens (default 64)")
    parser.add_argument("--output-len", type=units.at_least(1), default=8, help="output tokens (default 8)")
    parser.add_argument("--json", type=Path, help="write the phases and the added latency as JSON")


def run(args: argparse.Namespace) -> int:
    gateways = flags.names(args.gateways)
    bad = [g for g in gateways if g not in _PHASES]
    if bad or not gateways:
        print(f"picker bench gateways: unknown gateway(s) {bad}; choose from envoy, ngf", file=sys.stderr)
        return 2
    try:
        envoy_bin = envoy.envoy_binary() if "envoy" in gateways else ""
        if "ngf" in gateways:
            ngf.nginx_binary()
            ngf.shim_binary()
    except (envoy.EnvoyNotFound, ngf.NgfNotFound) as exc:
        print(f"picker bench gateways: {exc}", file=sys.stderr)
        return 2
    workload = wl.fixed_lengths(prompt_len=args.prompt_len, output_len=args.output_len)
    rows: list[lab_report.Row] = []
    added: dict[str, float] = {}
    try:
        for gateway in gateways:
            plan = demo.DemoPlan(sims=args.sims, rate=args.rate, duration_s=args.duration, gateway=gateway)
            pair = []
            for label in _PHASES[gateway]:
                print(f"{label}: {args.duration:g} s at {args.rate:g} req/s", flush=True)
                result, servers = asyncio.run(demo.phase(label, plan, workload, envoy_bin, lambda _c: None))
                pair.append(lab_report.make_row(label, result, servers))
            rows += pair
            added[gateway] = pair[1].summary.ttft_s.p50 - pair[0].summary.ttft_s.p50
    except procs.ChildFailed as exc:
        print(f"picker bench gateways: {exc}", file=sys.stderr)
        return 1
    lab_report.print_rows(
        f"{args.prompt_len}-token prompts, {args.output_len} output tokens, {args.sims} servers, {args.rate:g} req/s",
        rows,
    )
    for gateway, seconds in added.items():
        print(f"{gateway}: picker's path adds {seconds * 1000:.1f} ms to TTFT p50")
    if args.json is not None:
        doc = {"phases": [lab_report.row_json(r) for r in rows], "added_ttft_p50_s": added}
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    failed = sum(r.summary.failed for r in rows)
    return 1 if failed else 0
