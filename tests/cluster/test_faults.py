"""The Kubernetes rows of docs/reliability.md against the real control plane.

picker (as the chart's ServiceAccount) reaches kube-apiserver through a loopback TCP relay the test can cut, so
picker alone loses the API while the test keeps changing the cluster through it:

- **watch cut**: kube-apiserver restarts; a pod deleted right after it is back leaves picker's endpoints.
- **410 Gone**: while picker is cut off, a pod is deleted and one added, kube-apiserver restarts and etcd compacts
  its history; picker's watch from its old resourceVersion is answered 410 and it relists.
- **API down 5 s**: picker keeps serving its last endpoints through the outage; a pod deleted meanwhile leaves
  within a backoff period (4 s) of the API's return.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from picker.bench.cluster import ControlPlane
from picker.procutil import free_ports
from tests.cluster.stack import Picker, eventually, namespace, picker_serve, pool_values, release, sims

pytestmark = pytest.mark.timeout(180)

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
LABELS = {"app": "sim"}
BACKOFF_MAX_S = 4.0  # picker's default cap on list/watch retries: how long an outage can hide a change
SERVING = health_pb2.HealthCheckResponse.SERVING


class Relay:
    """A loopback TCP relay to kube-apiserver; ``cut()`` drops every connection and refuses new ones."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_ports(1)[0]
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.difference_update((writer, up_writer))


@contextlib.asynccontextmanager
async def relay(cp: ControlPlane) -> AsyncIterator[Relay]:
    r = Relay(cp.apiserver_port)
    await r.start()
    try:
        yield r
    finally:
        await r.cut()


def restart_apiserver(cp: ControlPlane, *, compact: bool = False) -> None:
    cp.stop("kube-apiserver")
    if compact:
        compact_etcd(cp)
    cp.start_apiserver()


def compact_etcd(cp: ControlPlane) -> int:
    """Compact etcd's whole history up to now (etcd's JSON gateway); the revision compacted to."""

    def post(path: str, body: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(f"{cp.etcd_url}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            answer = json.loads(resp.read())
        assert isinstance(answer, dict)
        return answer

    header = post("/v3/kv/range", {"key": "AA=="})["header"]  # any key: the header carries the revision
    assert isinstance(header, dict)
    revision = int(header["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision


async def endpoints_are(p: Picker, want: set[str]) -> bool:
    return await p.endpoints() == want


@contextlib.asynccontextmanager
async def pool_with_picker(
    cp: ControlPlane, ns: str, tmp: Path, server: str
) -> AsyncIterator[tuple[Picker, dict[str, str]]]:
    (port,) = free_ports(1, hosts=HOSTS)
    release(cp, ns, pool_values(LABELS, port), tmp)
    async with sims(HOSTS, port):
        cp.fake_pod(ns, "p1", LABELS, HOSTS[0])
        cp.fake_pod(ns, "p2", LABELS, HOSTS[1])
        async with picker_serve(cp, ns, tmp, server=server) as p:
            key = {f"p{i + 1}": f"{ip}:{port}" for i, ip in enumerate(HOSTS)}
            await eventually(lambda: endpoints_are(p, {key["p1"], key["p2"]}), what="two endpoints")
            yield p, key
            # Through every fault the pool stayed known (never "gone", which would empty the endpoints).
            assert not p.log_lines("is gone; no endpoints"), p.log()
            assert not p.log_lines("InferencePool CRD"), p.log()


async def test_watch_cut_by_apiserver_restart(control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    with namespace(cp, "fault-cut") as ns:
        async with pool_with_picker(cp, ns, tmp_path, cp.server) as (p, key):
            restart_apiserver(cp)  # not in a thread: the new process's parent-death signal follows its parent thread
            deleted_at = time.monotonic()
            cp.kubectl("delete", "pod", "p2", "-n", ns, "--wait=false")
            await eventually(lambda: endpoints_are(p, {key["p1"]}), what="p2 gone", timeout_s=BACKOFF_MAX_S + 3)
            print(f"watch cut: p2 left {time.monotonic() - deleted_at:.2f} s after its deletion")
            assert await p.health() == SERVING


async def test_gone_after_etcd_compaction(control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    with namespace(cp, "fault-gone") as ns:
        async with relay(cp) as r, pool_with_picker(cp, ns, tmp_path, f"https://127.0.0.1:{r.port}") as (p, key):
            await r.cut()
            cp.kubectl("delete", "pod", "p2", "-n", ns, "--wait=false")
            cp.fake_pod(ns, "p3", LABELS, HOSTS[2])
            restart_apiserver(cp, compact=True)
            back_at = time.monotonic()
            await r.start()
            await eventually(
                lambda: endpoints_are(p, {key["p1"], key["p3"]}), what="relisted", timeout_s=BACKOFF_MAX_S + 3
            )
            print(f"410 Gone: endpoints right {time.monotonic() - back_at:.2f} s after the API's return")
            assert p.log_lines("relisting"), p.log()  # the watch's resourceVersion was gone: 410, then a list


async def test_api_down_5s_with_a_pod_deleted_meanwhile(control_plane: ControlPlane, tmp_path: Path) -> None:
    cp = control_plane
    with namespace(cp, "fault-down") as ns:
        async with relay(cp) as r, pool_with_picker(cp, ns, tmp_path, f"https://127.0.0.1:{r.port}") as (p, key):
            await r.cut()
            cp.kubectl("delete", "pod", "p2", "-n", ns, "--wait=false")
            await asyncio.sleep(5)
            # Through the outage picker serves with what it knew last.
            assert await p.endpoints() == {key["p1"], key["p2"]}
            assert await p.health() == SERVING
            back_at = time.monotonic()
            await r.start()
            await eventually(lambda: endpoints_are(p, {key["p1"]}), what="p2 gone", timeout_s=BACKOFF_MAX_S + 3)
            print(f"API down 5 s: p2 left {time.monotonic() - back_at:.2f} s after the API's return")
