"""Two ``picker serve`` instances in process, peered over mutual TLS with a shared --cert-path: a request routed by
one teaches the other where its prefix went, and each sees the other's in-flight requests."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import orjson
import pytest
from prometheus_client import generate_latest

from picker import app, errors
from picker.extproc import tls
from picker.peers.exchange import prefix_scorers
from picker.settings import PeerSettings, ServerSettings, Settings
from picker.telemetry import REGISTRY
from tests.conftest import endpoint
from tests.extproc.conftest import make_store
from tests.extproc.gateway import EnvoyFullDuplex, gateway

SYSTEM = "You are a helpful assistant who answers in French. " * 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def replica(cert_dir: Path, port: int, peers: tuple[str, ...]) -> AsyncIterator[app.Running]:
    settings = Settings(
        server=ServerSettings(
            host="127.0.0.1", grpc_port=0, health_port=0, metrics_port=0, cert_path=str(cert_dir), termination_grace_s=1
        ),
        peers=PeerSettings(peers=peers, port=port),
    )
    async with app.serving(settings, store=make_store([endpoint(i) for i in (1, 2, 3)]), scrape=False) as running:
        yield running


async def until(check: object, timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # type: ignore[operator]  # noqa: ASYNC110 - polls state of other tasks
            await asyncio.sleep(0.02)


async def test_two_replicas_share_placements_and_in_flight(tmp_path: Path) -> None:
    pair = tls.self_signed()
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    pa, pb = free_port(), free_port()
    peers = (f"127.0.0.1:{pa}", f"127.0.0.1:{pb}")  # the same list for both: each leaves itself out
    async with replica(tmp_path, pa, peers) as a, replica(tmp_path, pb, peers) as b:
        assert (a.peer_port, b.peer_port) == (pa, pb)
        assert a.mesh is not None
        assert b.mesh is not None
        await until(lambda: a.mesh.connected == [peers[1]] and b.mesh.connected == [peers[0]])
        creds = grpc.ssl_channel_credentials(root_certificates=pair.cert_pem)
        body = orjson.dumps({"model": "m", "prompt": SYSTEM + "Bonjour?"})
        async with gateway(EnvoyFullDuplex, a.grpc_target, creds) as gw:
            out = await gw.request({":path": "/v1/completions"}, [body])
        [scorer_b] = prefix_scorers(b.scheduler.config.plugins).values()
        await until(lambda: scorer_b.index.size > 0)
        holders = set(scorer_b.index.match(_hashes(scorer_b, SYSTEM + "Bonjour?")))
        assert holders == {out.destination}
        # an endpoint the request above did not go to (its own lease may still be held)
        key = next(k for k in ("192.168.1.1:8000", "192.168.1.2:8000") if k != out.destination)
        lease = a.inflight.acquire(key, 500, 0.0)
        other = b.store.current().get(key)
        assert other is not None
        ctx_b = b.scheduler._ctx  # the replica's plugin context, as its plugins see it
        await until(lambda: ctx_b.ledger_requests(key) == 1)
        assert ctx_b.ledger_tokens([other]) == [500]
        assert b.inflight.requests(key) == 0  # b's own ledger: the count is a's, seen through the exchange
        a.inflight.release(lease)
        await until(lambda: ctx_b.ledger_requests(key) == 0)
        text = generate_latest(REGISTRY).decode()
        assert 'picker_peer_links{state="connected"} 1.0' in text
        assert "picker_peer_states 1.0" in text
        sent = [line for line in text.splitlines() if line.startswith('picker_peer_batches_total{direction="sent"}')]
        assert len(sent) == 2  # one collector per replica in this process, both counting
        assert all(float(line.rpartition(" ")[2]) > 0 for line in sent)
    assert "picker_peer_links" not in generate_latest(REGISTRY).decode()  # unregistered at exit


def _hashes(scorer: object, prompt: str) -> tuple[int, ...]:
    from picker.scheduling.plugins.prefix import PrefixCacheScorer
    from picker.scheduling.plugins.prefix_index import prefix_hashes

    assert isinstance(scorer, PrefixCacheScorer)
    return prefix_hashes(prompt, scorer.block_chars(endpoint(1)), 256, "m")


def test_peer_flags() -> None:
    parser = argparse.ArgumentParser()
    app.configure(parser)
    settings = app.settings_from_args(
        parser.parse_args(["--peers", "10.0.0.1,10.0.0.2:7", "--peer-flush-interval", "5ms"])
    )
    assert settings.peers == PeerSettings(peers=("10.0.0.1:9005", "10.0.0.2:7"), flush_interval_s=0.005)
    assert settings.peers.enabled
    assert not app.settings_from_args(parser.parse_args([])).peers.enabled
    for argv in (["--peers", "10.0.0.1:x"], ["--peer-service", "picker", "--peer-port", "0"]):
        with pytest.raises(errors.ConfigError):
            app.settings_from_args(parser.parse_args(argv))
