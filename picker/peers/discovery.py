"""Where the peers are: a static list (``--peers``), or the EndpointSlices of picker's own Service.

``--peer-service NAME`` lists and watches ``discovery.k8s.io/v1`` EndpointSlices labelled
``kubernetes.io/service-name=NAME`` in picker's namespace, through the same informer (list-then-watch, resync,
backoff) as the pool discovery. Every address of every slice is a peer at ``--peer-port``, ready or not: a replica
that is draining still has requests in flight, and its counts still matter; only endpoints the slice marks as
terminated-and-gone are absent anyway. This replica's own address (``$POD_IP``) is left out.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from picker.endpoints.model import format_hostport

if TYPE_CHECKING:
    from picker.discovery.informer import Informer
    from picker.discovery.kubesettings import KubeSettings

__all__ = ["SERVICE_LABEL", "parse_peers", "slice_addresses", "watch_service"]

SERVICE_LABEL = "kubernetes.io/service-name"
MAX_PEERS = 64  # more addresses than this are ignored (a full mesh of 64 is already 4032 links)


def parse_peers(text: str, default_port: int) -> tuple[str, ...]:
    """``host[:port],...`` → ``host:port`` addresses (IPv6 in brackets); ``ValueError`` for a bad entry."""
    out = []
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        host, port = item, default_port
        if item.startswith("["):
            end = item.find("]")
            if end < 0:
                raise ValueError(f"bad peer {item!r}")
            host, rest = item[1:end], item[end + 1 :]
            if rest:
                if not rest.startswith(":"):
                    raise ValueError(f"bad peer {item!r}")
                port = _port(rest[1:], item)
        elif item.count(":") == 1:
            host, text_port = item.split(":")
            port = _port(text_port, item)
        if not host:
            raise ValueError(f"bad peer {item!r}")
        out.append(format_hostport(host, port))
    return tuple(dict.fromkeys(out))


def _port(text: str, item: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"bad peer port in {item!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad peer port in {item!r}")
    return port


def slice_addresses(slices: Iterable[Mapping[str, Any]], port: int, exclude: Iterable[str] = ()) -> list[str]:
    """The peers named by EndpointSlice objects: every endpoint address, at ``port``, but ``exclude``."""
    skip = set(exclude)
    out: list[str] = []
    for obj in slices:
        endpoints = obj.get("endpoints")
        if not isinstance(endpoints, list):
            continue
        for ep in endpoints:
            addresses = ep.get("addresses") if isinstance(ep, dict) else None
            if not isinstance(addresses, list):
                continue
            for address in addresses[:1]:  # "consumers must assume all addresses are fungible": one is enough
                if isinstance(address, str) and address and address not in skip:
                    out.append(format_hostport(address, port))
    return sorted(set(out))[:MAX_PEERS]


async def watch_service(
    *,
    kube: KubeSettings,
    service: str,
    port: int,
    on_peers: Callable[[list[str]], None],
    exclude: Iterable[str] = (),
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> None:
    """Call ``on_peers`` with the peer addresses after every change of the Service's EndpointSlices; until
    cancelled."""
    # Imported here: kubernetes-asyncio is heavy, and only this task needs it.
    from picker.discovery.informer import Informer, InformerTiming
    from picker.discovery.kubeapi import KubeApi, Resource, connect

    skip = tuple(exclude)
    resource = Resource(
        "discovery.k8s.io", "v1", "endpointslices", kube.pool_namespace, label_selector=f"{SERVICE_LABEL}={service}"
    )
    timing = InformerTiming(
        resync_s=kube.resync_s,
        watch_timeout_s=kube.watch_timeout_s,
        backoff_initial_s=kube.backoff_initial_s,
        backoff_max_s=kube.backoff_max_s,
        absent_recheck_s=kube.crd_recheck_s,
    )
    last: list[str] | None = None

    def changed(informer: Informer, _: str | None) -> None:
        nonlocal last
        peers = slice_addresses(informer.items.values(), port, skip)
        if peers != last:
            last = peers
            on_peers(peers)

    async with connect(api_server=kube.api_server, kubeconfig=kube.kubeconfig, in_cluster=kube.in_cluster) as client:
        api = KubeApi(client, request_timeout_s=kube.request_timeout_s)
        informer = Informer(api, resource, on_change=changed, timing=timing, clock=clock, rng=rng or random.Random())
        await informer.run()
    await asyncio.Event().wait()  # not reached: the informer runs until cancelled
