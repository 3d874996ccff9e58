"""Run the fault scenarios and print the docs/reliability.md table.

.venv/bin/python -m tests.reliability.report            # CI-sized
.venv/bin/python -m tests.reliability.report --long     # the documented sizes (minutes)
.venv/bin/python -m tests.reliability.report server_killed api_down
.venv/bin/python -m tests.reliability.report server_hung --picker-arg=--hung-server-detection=false   # "before"
"""

from __future__ import annotations

import argparse
import asyncio

from tests.reliability import harness
from tests.reliability.harness import Row
from tests.reliability.scenarios import SCENARIOS

HEADER = (
    "| case | what the client saw | latency p50 / p99 (ok) | recovery | requests lost | goal met | notes |\n"
    "|---|---|---|---|---|---|---|"
)


async def main(names: list[str], long: bool) -> list[Row]:
    rows = []
    for name in names:
        row = await SCENARIOS[name](long)
        print(row.markdown(), flush=True)
        rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help=f"scenarios (default all): {', '.join(SCENARIOS)}")
    parser.add_argument("--long", action="store_true")
    parser.add_argument("--picker-arg", action="append", default=[], help="a flag added to every picker started")
    args = parser.parse_args()
    harness.EXTRA_PICKER_ARGS.extend(args.picker_arg)
    print(HEADER, flush=True)
    asyncio.run(main(args.names or list(SCENARIOS), args.long))
