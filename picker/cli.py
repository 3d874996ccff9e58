"""The ``picker`` command: subcommands → Settings → one async entry each.

Each subcommand lives in its own module, imported only when it runs (``picker sim`` never loads gRPC). A
subcommand module defines ``configure(parser)`` to add its flags and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

__all__ = ["SUBCOMMANDS", "main"]


class _Subcommand(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# name -> (module, one-line help). The one explicit table of subcommands.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("picker.serve", "run the endpoint picker (ext_proc gRPC server)"),
    "sim": ("picker.sim.cli", "run a vLLM-compatible simulated model server"),
    "load": ("picker.bench.load_cli", "drive load at an OpenAI-compatible URL and report TTFT/TPOT"),
    "tokens": ("picker.bench.tokens_cli", "tokenize text through a server's /tokenize"),
    "bench": ("picker.bench.cli", "benchmarks: overhead, scrape-parse, lab, ..."),
    "demo": ("picker.bench.demo", "simulated servers + picker + real Envoy vs round robin, side by side"),
}


def _load(name: str) -> _Subcommand:
    module, _ = SUBCOMMANDS[name]
    return cast(_Subcommand, importlib.import_module(module))


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(prog="picker", description="Inference-aware endpoint picker")
    top.add_argument("--version", action="store_true", help="print the version and exit")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0
    if argv[0] == "--version":
        from picker import __version__

        print(__version__)
        return 0
    name = argv[0]
    if name not in SUBCOMMANDS:
        top.error(f"unknown command {name!r}; choose from {', '.join(SUBCOMMANDS)}")
    try:
        command = _load(name)
    except ModuleNotFoundError as exc:
        print(f"picker {name}: not available ({exc})", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog=f"picker {name}", description=SUBCOMMANDS[name][1])
    command.configure(parser)
    args = parser.parse_args(argv[1:])
    return command.run(args)


if __name__ == "__main__":
    sys.exit(main())
