"""``picker bench NAME``: the benchmarks, each a module with ``configure(parser)`` and ``run(args)``."""

from __future__ import annotations

import argparse
import importlib
from typing import Protocol, cast

__all__ = ["BENCHMARKS", "configure", "run"]

BENCHMARKS: dict[str, tuple[str, str]] = {
    "overhead": ("picker.bench.overhead", "picker vs a do-nothing ext_proc server over real gRPC"),
    "schedule": ("picker.bench.schedule", "one scheduling cycle in process, by endpoint count and prompt size"),
    "scrape-parse": ("picker.bench.scrape_parse", "metrics page parser vs prometheus_client"),
    "lab": ("picker.bench.lab_cli", "policy lab: routing policies against simulated engines in virtual time"),
    "kv-index": ("picker.bench.kv_index", "KV-block index: memory per block, KV-event ingest rate, lookup time"),
    "kv-lab": ("picker.bench.kv_lab", "lab: precise vs approximate vs no prefix affinity, KV events, replicas"),
    "kv-live": ("picker.bench.kv_live", "live: precise vs approximate vs none, real sims, picker replicas, Envoy"),
    "gateways": ("picker.bench.gateways", "Envoy and NGINX Gateway Fabric paths: what picker's path adds per request"),
    "soak": ("picker.bench.soak", "a long steady run with pods churning: picker's memory, fds, tasks, leases"),
    "lab-eval": ("picker.bench.lab_eval", "lab report: picker's default vs the baselines over the standard workloads"),
    "bypass": ("picker.bench.bypass", "live: picker follows load that bypasses the gateway (real Envoy, simulators)"),
    "lab-pd": ("picker.bench.lab_pd_cli", "policy lab: prefill/decode disaggregated fleets vs aggregated ones"),
    "lab-ha": ("picker.bench.lab_ha", "lab: picker replicas independent vs with the peer exchange (docs/ha.md)"),
    "seed-mix": ("picker.bench.seed_mix", "live: the seed's mix through Envoy, LEAST_REQUEST / ROUND_ROBIN vs picker"),
}


class _Benchmark(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="benchmark", metavar="BENCHMARK", required=True)
    for name, (module, help_text) in BENCHMARKS.items():
        bench = cast(_Benchmark, importlib.import_module(module))
        bench.configure(sub.add_parser(name, help=help_text))


def run(args: argparse.Namespace) -> int:
    bench = cast(_Benchmark, importlib.import_module(BENCHMARKS[args.benchmark][0]))
    return bench.run(args)
