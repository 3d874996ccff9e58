"""``picker serve``: one picker process, or a supervisor of ``--workers N`` picker processes on the same ports.

Python runs one scheduling cycle at a time per process, so one process tops out at about one core. With
``--workers N`` the supervisor (this process) starts N workers, each a whole picker (``app.serve``):

* every worker listens on the same ext_proc and health ports (SO_REUSEPORT: the kernel spreads the gateway's
  connections over them; Envoy opens one connection per worker thread, so a gateway with fewer connections than
  picker has workers leaves some idle);
* the workers are each other's active-active peers (docs/ha.md) over loopback: each one's in-flight requests
  and prefix placements reach the others within ``--peer-flush-interval``, so they schedule as one picker;
* the workers poll each model server once between them, not once each: a server's ``/metrics`` is polled by the
  worker its key hashes to, and the exchange carries the outcome to the others (picker/scrape/share.py; a dead
  worker's servers are polled by the others until it is back);
* with TLS and no ``--cert-path`` the supervisor makes the self-signed pair once, in a private directory, so
  every connection sees the same certificate and the peers can authenticate each other;
* each worker serves /metrics on a loopback port; the supervisor serves the pod's ``--metrics-port`` with the
  merge of the workers' pages (telemetry/merge.py), behind the same authentication;
* SIGTERM is passed on and every worker drains as a single picker does; a worker that dies is restarted
  (backoff 1 s, doubling to 30 s); one that exits with a configuration error stops them all (exit 2).

``--workers 0`` (the default) runs as many workers as the container's CPU limit (cgroup ``cpu.max``) allows, and
one without a limit: a pod without a CPU limit shares its node, and taking every core of it is not a default.
Several workers do not combine with leader election or with peers in other pods (``--peers``,
``--peer-service``): the automatic count is then 1, and an explicit N > 1 is refused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

import aiohttp
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from picker import app, compat, errors, procutil
from picker.discovery.kubesettings import KubeSettings
from picker.extproc import tls
from picker.settings import Settings
from picker.telemetry import logs
from picker.telemetry.merge import CounterCarry, merge_pages

__all__ = [
    "WORKER_FLUSH_INTERVAL_S",
    "WorkerPlan",
    "configure",
    "cpu_limit",
    "run",
    "supervise",
    "with_worker_flush",
    "worker_count",
]

log = logging.getLogger("picker")

CGROUP_ROOT = "/sys/fs/cgroup"
_LOOPBACK = "127.0.0.1"
_POLL_S = 0.1
_BACKOFF_MAX_S = 30.0
_MAX_WORKER_PAGE_BYTES = 8 * 1024 * 1024
_SCRAPE_TIMEOUT_S = 2.0
# Between workers, unless --peer-flush-interval says otherwise: the exchange's cost is per batch, and at the default
# between pods a busy worker sends about one batch per request; a longer interval between workers cuts that cost
# without moving placements (measured in docs/performance.md, "Workers").
WORKER_FLUSH_INTERVAL_S = 0.005

configure = app.configure


def run(args: argparse.Namespace) -> int:
    try:
        settings, kube = app.load(args)
        count = worker_count(args.workers, settings, kube, limit=cpu_limit())
    except errors.ConfigError as exc:
        print(f"picker serve: {exc}", file=sys.stderr)
        return 2
    logs.configure(settings.log_level, settings.log_format)
    for warning in compat.unhonoured(args):
        log.warning(warning)
    if count == 1:
        return app.run_settings(settings, kube)
    try:
        plan = WorkerPlan.build(with_worker_flush(settings, args.peer_flush_interval), count)
    except errors.ConfigError as exc:
        log.error("configuration error: %s", exc)
        return 2
    try:
        return asyncio.run(supervise(plan, kube))
    finally:
        plan.close()


def cpu_limit(root: str = CGROUP_ROOT) -> float | None:
    """The container's CPU limit in cores (cgroup v2 ``cpu.max``, else v1 ``cpu.cfs_quota_us``), None if none."""
    try:
        quota, period = Path(root, "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(Path(root, "cpu", "cpu.cfs_quota_us").read_text())
        period_us = int(Path(root, "cpu", "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def worker_count(requested: int, settings: Settings, kube: KubeSettings | None, *, limit: float | None) -> int:
    """``--workers``: N as given (checked), or for 0 what ``limit`` (cores; None: no limit) allows."""
    if requested < 0:
        raise errors.ConfigError(f"--workers must be 0 (automatic) or more, not {requested}")
    clash = _clash(settings, kube)
    if requested == 0:
        if clash or limit is None:
            return 1
        return max(1, min(math.floor(limit + 1e-9), len(os.sched_getaffinity(0))))
    if requested > 1 and clash:
        raise errors.ConfigError(f"--workers {requested} does not combine with {clash}")
    return requested


def with_worker_flush(settings: Settings, given_s: float | None) -> Settings:
    """``settings`` with the workers' flush interval: ``--peer-flush-interval``, else ``WORKER_FLUSH_INTERVAL_S``."""
    flush_s = given_s if given_s is not None else WORKER_FLUSH_INTERVAL_S
    return dataclasses.replace(settings, peers=dataclasses.replace(settings.peers, flush_interval_s=flush_s))


def _clash(settings: Settings, kube: KubeSettings | None) -> str:
    if kube is not None and kube.leader_election:
        return "leader election (workers are active-active; use one worker per leader-elected replica)"
    if settings.peers.enabled:
        return "--peers/--peer-service (peers in other pods cannot reach this pod's workers)"
    return ""


@dataclass
class WorkerPlan:
    """The ports and settings of N workers. ``close`` removes the generated certificate pair."""

    settings: Settings  # the supervisor's own, as given
    count: int
    grpc_port: int
    health_port: int
    metrics_ports: tuple[int, ...]  # each worker's loopback /metrics
    peer_ports: tuple[int, ...]
    cert_dir: tempfile.TemporaryDirectory[str] | None = None

    @classmethod
    def build(cls, settings: Settings, count: int) -> WorkerPlan:
        """Checks the shared ports are free (a taken one is a ConfigError, as for one picker: SO_REUSEPORT must
        not let the workers join a stranger's port), picks loopback ports, writes the self-signed pair."""
        srv = settings.server
        grpc_port = _claim(srv.host, srv.grpc_port, "--grpc-port")
        health_port = _claim(srv.host, srv.health_port, "--grpc-health-port")
        loopback = procutil.free_ports(2 * count)  # not ephemeral ones: see procutil
        metrics_ports = tuple(loopback[:count]) if srv.metrics_port else (0,) * count
        cert_dir = None
        if srv.secure_serving and not srv.cert_path:
            cert_dir = tempfile.TemporaryDirectory(prefix="picker-tls-")
            pair = tls.self_signed((srv.host, os.environ.get("POD_IP", "")))
            key_path = Path(cert_dir.name, "tls.key")
            key_path.touch(mode=0o600)
            key_path.write_bytes(pair.key_pem)
            Path(cert_dir.name, "tls.crt").write_bytes(pair.cert_pem)
        return cls(settings, count, grpc_port, health_port, metrics_ports, tuple(loopback[count:]), cert_dir)

    def settings_for(self, index: int) -> Settings:
        srv = self.settings.server
        peers = tuple(f"{_LOOPBACK}:{p}" for i, p in enumerate(self.peer_ports) if i != index)
        return dataclasses.replace(
            self.settings,
            server=dataclasses.replace(
                srv,
                grpc_port=self.grpc_port,
                health_port=self.health_port,
                reuse_port=True,
                metrics_port=self.metrics_ports[index],
                metrics_host=_LOOPBACK,
                # the supervisor checks the pod's scrapers; the loopback page needs no token
                metrics_auth_token_file=None,
                metrics_endpoint_auth=False,
                cert_path=self.cert_dir.name if self.cert_dir is not None else srv.cert_path,
            ),
            peers=dataclasses.replace(
                self.settings.peers, peers=peers, port=self.peer_ports[index], bind_host=_LOOPBACK
            ),
            # each server polled once for the pod, its outcome shared over the exchange (picker/scrape/share.py)
            scrape=dataclasses.replace(self.settings.scrape, share_index=index, share_count=self.count),
        )

    def close(self) -> None:
        if self.cert_dir is not None:
            self.cert_dir.cleanup()


def _claim(host: str, port: int, flag: str) -> int:
    """``port`` if nothing listens there (any free port for 0). Raises ``errors.ConfigError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as exc:
            raise errors.ConfigError(f"cannot listen on {host}:{port} ({flag}): {exc.strerror or exc}") from exc
        return int(s.getsockname()[1])


def _worker_main(settings: Settings, kube: KubeSettings | None, index: int, supervisor_pid: int) -> None:
    """A worker process: one whole picker (spawned: nothing is inherited but the arguments)."""
    procutil.die_with_parent()  # no orphan keeps the shared ports after the supervisor is SIGKILLed
    if os.getppid() != supervisor_pid:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
    logs.configure(settings.log_level, settings.log_format)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # until serve() takes over: the supervisor forwards SIGTERM
    log.info("worker starting", extra={"worker": index})
    sys.exit(app.run_settings(settings, kube))


@dataclass
class _Worker:
    index: int
    process: BaseProcess
    started: float
    died: float | None = None  # when the supervisor saw it dead
    restarts: int = 0
    backoff_s: float = 1.0


async def supervise(plan: WorkerPlan, kube: KubeSettings | None) -> int:
    """Run the plan's workers until SIGTERM/SIGINT; then pass it on and wait for them to drain. Exit code:
    0, or 2 when a worker stopped with a configuration error, or the first other failure."""
    spawn = multiprocessing.get_context("spawn")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        stop.set()
        for w in workers:  # a second signal is passed on too: the workers then skip their grace wait
            if w.process.is_alive() and w.process.pid is not None:
                os.kill(w.process.pid, signal.SIGTERM)

    def start(index: int) -> BaseProcess:
        p = spawn.Process(
            target=_worker_main,
            args=(plan.settings_for(index), kube, index, os.getpid()),
            name=f"picker-worker-{index}",
        )
        p.start()
        return p

    workers: list[_Worker] = []
    srv = plan.settings.server
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_SCRAPE_TIMEOUT_S))
    restarts_total = 0

    carry = CounterCarry()
    last_pages: dict[int, str] = {}  # each worker's last page: its counts stand in while it does not answer
    merging = asyncio.Lock()  # the carry's state: one merge at a time

    async def page() -> bytes:
        ports = [(i, port) for i, port in enumerate(plan.metrics_ports) if port]
        pages = await asyncio.gather(*(_fetch(session, port) for _, port in ports))
        fresh = {i: text for (i, _), text in zip(ports, pages, strict=True) if text is not None}
        last_pages.update(fresh)
        workers_seen = sorted(last_pages)
        stale = {n for n, i in enumerate(workers_seen) if i not in fresh}
        gauge = GaugeMetricFamily("picker_workers", "picker's worker processes (--workers)", labels=["state"])
        gauge.add_metric(["configured"], plan.count)
        gauge.add_metric(["alive"], sum(w.process.is_alive() for w in workers))
        gauge.add_metric(["scraped"], len(fresh))
        restarts = GaugeMetricFamily("picker_worker_restarts", "worker processes restarted after dying")
        restarts.add_metric([], restarts_total)
        extra: list[Metric] = [gauge, restarts]
        merge = functools.partial(
            merge_pages,
            [last_pages[i] for i in workers_seen],
            extra,
            workers=workers_seen,
            carry=carry,
            stale=stale,
        )
        async with merging:
            try:
                return await loop.run_in_executor(None, merge)
            except ValueError:
                log.exception("a worker's /metrics page is not the text format")
                last_pages.clear()
                return await loop.run_in_executor(None, merge_pages, [], extra)

    authorize, close_auth = app.metrics_authorizer(srv, kube)
    try:  # before any worker starts: a taken metrics port fails the start as for one picker
        metrics = await app.start_metrics(srv.host, srv.metrics_port, authorize, close_auth, render=page)
    except errors.ConfigError as exc:  # the port is taken
        await session.close()
        log.error("configuration error: %s", exc)
        return 2
    workers.extend(_Worker(i, start(i), time.monotonic()) for i in range(plan.count))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    log.info(
        "picker serving with workers",
        extra={"workers": plan.count, "grpc_port": plan.grpc_port, "health_port": plan.health_port},
    )
    code = 0
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), _POLL_S)
            if stop.is_set():
                break
            now = time.monotonic()
            for w in workers:
                exit_code = w.process.exitcode
                if exit_code is None:
                    continue
                if exit_code == 2:
                    log.error("worker stopped with a configuration error; stopping", extra={"worker": w.index})
                    code = 2
                    on_signal()
                    break
                if w.died is None:
                    w.died = now
                    if now - w.started > 60.0:
                        w.backoff_s = 1.0  # it ran a good while: a fresh failure, not a crash loop
                    log.error(
                        "worker died; restarting it",
                        extra={"worker": w.index, "exit_code": exit_code, "in_s": w.backoff_s},
                    )
                if now - w.died < w.backoff_s:
                    continue
                w.process.close()
                carry.restarted(w.index)  # what it counted stays in the pod's counters
                last_pages.pop(w.index, None)
                w.process, w.started, w.died = start(w.index), now, None
                w.restarts += 1
                restarts_total += 1
                w.backoff_s = min(w.backoff_s * 2, _BACKOFF_MAX_S)
        drain_s = srv.grace_period_s + srv.termination_grace_s + 5.0
        await loop.run_in_executor(None, _join_all, [w.process for w in workers], drain_s)
        for w in workers:
            if w.process.is_alive():
                log.error("worker did not stop in time; killing it", extra={"worker": w.index})
                w.process.kill()
            w.process.join()
            if code == 0 and w.process.exitcode not in (0, None):
                code = w.process.exitcode if w.process.exitcode > 0 else 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for w in workers:
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
        if metrics is not None:
            await metrics.cleanup()
        await session.close()
    log.info("picker stopped", extra={"workers": plan.count, "signals": signals})
    return code


def _join_all(processes: list[BaseProcess], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))


async def _fetch(session: aiohttp.ClientSession, port: int) -> str | None:
    """A worker's /metrics page, or None when it does not answer (starting, restarting) or answers too much."""
    try:
        async with session.get(f"http://{_LOOPBACK}:{port}/metrics") as resp:
            if resp.status != 200:
                return None
            body = await resp.content.read(_MAX_WORKER_PAGE_BYTES + 1)
            if len(body) > _MAX_WORKER_PAGE_BYTES:
                log.warning("a worker's /metrics page is over the size limit", extra={"port": port})
                return None
            return body.decode()
    except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError):
        return None
