"""Three active-active pickers behind the real Envoy, peered (``--peers``); one is killed (SIGKILL) under load.

Envoy's settings are the ones docs/ha.md recommends for active-active: the picker cluster holds every replica,
health-checked over gRPC every 200 ms (one failure marks a host down, panic threshold 0), and the ext_proc filter
fails open (``failure_mode_allow: true``): a stream whose picker dies mid-request continues without a decision and
the router sends it to the pool's fallback (round robin over the model servers), and a response whose picker dies
continues as is. So no request fails; the requests that lose their picker lose only its routing decision.

Quality after the kill is measured as prefix affinity: for each of the workload's prompt groups, the share of its
requests served by the group's most used backend. The survivors learned each other's (and the dead replica's)
placements through the exchange, so affinity after the kill stays at its level before it. The pickers run
``picker-v1``, whose prefix score follows the placements alone: these backends answer in the same time whatever is
cached, and the default (the server model) rightly gives their cache little weight.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import orjson
import pytest

from picker.bench.policies import PREVIOUS_CONFIG_TEXT
from tests.e2e.backends import Backend
from tests.e2e.procs import free_port, run_envoy, run_picker
from tests.e2e.test_rollout import Replica, backends, envoy_yaml, wait_healthy

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GROUPS = 6
SYSTEM = [f"System prompt {g}: you are assistant number {g}. " * 40 for g in range(GROUPS)]  # ~2 KB each
RATE_PER_S = 20.0


@dataclass
class Peer(Replica):
    peer_port: int = field(default_factory=free_port)

    def peer_args(self, backends_: Sequence[Backend], peers: Sequence[Peer]) -> list[str]:
        return [
            *self.args(backends_),
            "--peers", ",".join(f"127.0.0.1:{p.peer_port}" for p in peers),
            "--peer-port", str(self.peer_port),
        ]  # fmt: skip


@dataclass
class Sent:
    at: float
    group: int
    status: int
    backend: str


async def one(session: aiohttp.ClientSession, url: str, i: int, out: list[Sent]) -> None:
    # Seeded and not i % GROUPS: with round robin over 3 replicas that would send each group to one replica only.
    group = random.Random(i).randrange(GROUPS)
    body = orjson.dumps({"model": "m", "prompt": SYSTEM[group] + f"Question {i}?", "max_tokens": 2})
    at = time.monotonic()
    try:
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as resp:
            await resp.read()
            out.append(Sent(at, group, resp.status, resp.headers.get("x-backend", "")))
    except aiohttp.ClientError:
        out.append(Sent(at, group, 0, ""))


async def wait_meshed(session: aiohttp.ClientSession, replicas: Sequence[Peer], links: int) -> None:
    want = f'picker_peer_links{{state="connected"}} {float(links)}'
    async with asyncio.timeout(20):
        for r in replicas:
            while True:
                async with session.get(r.metrics_url) as resp:
                    if want in await resp.text():
                        break
                await asyncio.sleep(0.05)


def affinity(sent: Sequence[Sent]) -> float:
    """Per group, the share of its requests on its most used backend; averaged over requests."""
    by_group: dict[int, Counter[str]] = {}
    for s in sent:
        by_group.setdefault(s.group, Counter())[s.backend] += 1
    total = sum(sum(c.values()) for c in by_group.values())
    return sum(c.most_common(1)[0][1] for c in by_group.values()) / total if total else 0.0


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "independent"])
async def test_killing_one_of_three_active_active_pickers_fails_no_request(exchange: bool) -> None:
    """With the exchange, and (for contrast, measured but not bounded) three independent replicas."""
    replicas = [Peer(), Peer(), Peer()]

    def args(r: Peer) -> list[str]:
        pinned = [f"--config-text={PREVIOUS_CONFIG_TEXT}"]
        return [*(r.peer_args(servers, replicas) if exchange else r.args(servers)), *pinned]

    listen = {True: free_port()}
    admin = free_port()
    async with (
        backends(3, delay_s=0.3) as servers,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        # FailOpen listener only: listen_ports[False] is the FailClose one the helper always renders; not used.
        config = envoy_yaml({False: free_port(), **listen}, admin, replicas, servers)
        async with (
            run_picker(args(replicas[0]), health_url=replicas[0].metrics_url) as victim,
            run_picker(args(replicas[1]), health_url=replicas[1].metrics_url),
            run_picker(args(replicas[2]), health_url=replicas[2].metrics_url),
            run_envoy(config, admin),
        ):
            await wait_healthy(session, admin, {r.grpc_port for r in replicas})
            if exchange:  # every replica streams to both others before the load starts
                await wait_meshed(session, replicas, links=2)
            url = f"http://127.0.0.1:{listen[True]}/v1/completions"
            sent: list[Sent] = []
            killed_at = 0.0
            async with asyncio.TaskGroup() as tg:
                for i in range(int(6.0 * RATE_PER_S)):
                    if i == int(2.5 * RATE_PER_S):
                        victim.kill()  # SIGKILL: no drain, streams on it cut mid-flight
                        killed_at = time.monotonic()
                    tg.create_task(one(session, url, i, sent))
                    await asyncio.sleep(1 / RATE_PER_S)
            await wait_healthy(session, admin, {replicas[1].grpc_port, replicas[2].grpc_port})

    failed = [s for s in sent if s.status != 200]
    before = [s for s in sent if s.at < killed_at]
    after = [s for s in sent if s.at > killed_at + 1.0]
    assert len(sent) == 120
    assert failed == []
    assert len(before) >= 40
    assert len(after) >= 40
    a_before, a_after = affinity(before), affinity(after)
    mode = "peered" if exchange else "independent"
    print(
        f"\n3 {mode} active-active pickers, one SIGKILLed: {len(sent)} requests, {len(failed)} failed; "
        f"prefix affinity {a_before:.0%} before, {a_after:.0%} from 1 s after the kill"
    )
    if exchange:
        assert a_before >= 0.8
        assert a_after >= a_before - 0.1
