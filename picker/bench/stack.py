"""The live stack's processes, shared by ``picker demo`` (also ``--pd``) and ``picker bench bypass``: simulated
servers and ``picker serve``, each a child process (``procs.spawn``) that is stopped when its block exits, and
``watched``, a load run that fails as soon as one of them dies."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

from picker.bench import lab_report, procs
from picker.bench.load import LoadResult, RequestRecord

__all__ = ["by_position", "finish", "name_servers", "picker_serve", "sims", "stop_all", "watched"]


@contextlib.asynccontextmanager
async def sims(
    ports: Sequence[int],
    *,
    num_gpu_blocks: int | None,
    seed: int,
    on_start: Callable[[procs.Child], None],
    name: str = "sims",
    extra: Sequence[str] = (),
    preset: str = "h100-8b",
    hosts: Sequence[str] = (),
) -> AsyncIterator[procs.Child]:
    """``picker sim`` (``preset``; ``num_gpu_blocks`` None: the preset's) on ``ports`` of 127.0.0.1, or with
    ``hosts`` one server per address on the one port in ``ports``; one process, ready when every server answers
    /health."""
    argv = [*procs.picker_command(), "sim", "--preset", preset]
    if hosts:
        (port,) = ports
        argv += ["--hosts", ",".join(hosts), "--port", str(port)]
        addresses = [(host, port) for host in hosts]
    else:
        argv += ["--ports", ",".join(map(str, ports))]
        addresses = [("127.0.0.1", port) for port in ports]
    if num_gpu_blocks is not None:
        argv += ["--num-gpu-blocks", str(num_gpu_blocks)]
    argv += ["--seed", str(seed), *extra]
    async with procs.spawn(name, argv, on_start=on_start) as child:
        for host, port in addresses:
            await child.wait_http(f"http://{host}:{port}/health", 30.0)
        yield child


@contextlib.asynccontextmanager
async def picker_serve(
    ports: Sequence[int],
    *,
    scrape_interval: str,
    on_start: Callable[[procs.Child], None],
    config_file: str | None = None,
) -> AsyncIterator[tuple[procs.Child, int]]:
    """``picker serve`` (TLS, its built-in default unless ``config_file``) over the servers on ``ports``; yields
    the child and its ext_proc port once it serves metrics and has scraped every server a few times."""
    grpc, health, metrics = procs.free_port(), procs.free_port(), procs.free_port()
    argv = [*procs.picker_command(), "serve", "--endpoints", ",".join(f"127.0.0.1:{p}" for p in ports)]
    argv += ["--host", "127.0.0.1", "--grpc-port", str(grpc), "--grpc-health-port", str(health)]
    argv += ["--metrics-port", str(metrics), "--refresh-metrics-interval", scrape_interval]
    argv += ["--grace-period", "0s", "--termination-grace", "2s", "--log-level", "warning"]
    if config_file is not None:
        argv += ["--config-file", config_file]
    async with procs.spawn("picker", argv, on_start=on_start) as child:
        await child.wait_http(f"http://127.0.0.1:{metrics}/metrics", 30.0)
        await asyncio.sleep(0.3)  # a few scrapes: picker has seen every server
        yield child, grpc


async def watched(load: Coroutine[Any, Any, LoadResult], children: list[procs.Child]) -> LoadResult:
    """Run the load while checking every child stays up; a child that exits fails the phase at once."""
    task: asyncio.Task[LoadResult] = asyncio.ensure_future(load)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.5)
            if done:
                return task.result()
            for child in children:
                child.check()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def stop_all(children: Sequence[procs.Child]) -> None:
    """A phase's end: every child still up, then each stopped, last started first; one that exited with an error
    fails the phase (``procs.ChildFailed`` naming it)."""
    for child in children:
        child.check()
    codes = [(child.name, await child.stop()) for child in reversed(children)]
    bad = [f"{name} exited with {code}" for name, code in codes if code != 0]
    if bad:
        raise procs.ChildFailed("; ".join(bad))


def name_servers(records: Iterable[RequestRecord], names: Mapping[str, str]) -> None:
    """Rename each record's server (``sim-<port>``) by ``names``: each phase starts its servers on fresh ports, so
    the report names them by position or role instead."""
    for rec in records:
        if rec.backend is not None:
            rec.backend = names.get(rec.backend, rec.backend)


def by_position(ports: Sequence[int]) -> dict[str, str]:
    """``sim-<port>`` -> ``server-<i>`` in the order the servers were started."""
    return {f"sim-{p}": f"server-{i + 1}" for i, p in enumerate(ports)}


def finish(
    name: str,
    rows: Sequence[lab_report.Row],
    children: Sequence[procs.Child],
    json_path: Path | None,
    doc: Callable[[], dict[str, Any]],
) -> int:
    """A demo's end: ``doc()`` plus its processes written to ``json_path`` (if given); exit 1 when any request
    failed (saying which errors), else 0."""
    if json_path is not None:
        out = {
            **doc(),
            "processes": [{"name": c.name, "pid": c.pid, "returncode": c.returncode} for c in children],
        }
        json_path.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))
        print(f"wrote {json_path}")
    failed = sum(r.summary.failed for r in rows)
    if failed:
        errors = {k: v for r in rows for k, v in r.summary.errors.items()}
        print(f"{name}: {failed} requests failed: {errors}", file=sys.stderr)
        return 1
    return 0
