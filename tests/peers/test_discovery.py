"""Peer discovery: the static list's syntax, and the picker Service's EndpointSlices through the informer."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from picker.discovery.kubesettings import KubeSettings
from picker.discovery.rbac import PEER_RULES
from picker.peers.discovery import MAX_PEERS, parse_peers, slice_addresses, watch_service
from tests.kube.apiserver import FakeApiServer


def test_parse_peers() -> None:
    assert parse_peers("10.0.0.1:9005, 10.0.0.2 ,[fd00::1]:7,fd00::2,picker-0.picker:9,10.0.0.1:9005", 9005) == (
        "10.0.0.1:9005",
        "10.0.0.2:9005",
        "[fd00::1]:7",
        "[fd00::2]:9005",
        "picker-0.picker:9",
    )
    for bad in ("10.0.0.1:x", "10.0.0.1:0", "[fd00::1", "[fd00::1]x", ":9", "10.0.0.1:70000"):
        with pytest.raises(ValueError, match="bad peer"):
            parse_peers(bad, 9005)


def eps_slice(name: str, *addresses: str, service: str = "picker", ready: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": {"ready": ready}} for a in addresses],
        "ports": [{"name": "grpc", "port": 9002}],
    }


def test_slice_addresses() -> None:
    slices = [eps_slice("a", "10.0.0.1", "10.0.0.2"), eps_slice("b", "10.0.0.3", ready=False), {"endpoints": None}]
    assert slice_addresses(slices, 9005, exclude=["10.0.0.2"]) == ["10.0.0.1:9005", "10.0.0.3:9005"]
    many = [eps_slice("m", *(f"10.1.{i // 250}.{i % 250}" for i in range(MAX_PEERS + 10)))]
    assert len(slice_addresses(many, 9005)) == MAX_PEERS


async def test_the_service_endpointslices_are_followed() -> None:
    seen: list[list[str]] = []
    async with FakeApiServer() as api:
        api.create("endpointslices", eps_slice("picker-abc", "10.0.0.1", "10.0.0.9"))
        api.create("endpointslices", eps_slice("other-abc", "10.9.9.9", service="other"))
        settings = KubeSettings(pool_name="pool", api_server=api.url, backoff_initial_s=0.05)
        task = asyncio.create_task(
            watch_service(kube=settings, service="picker", port=9005, on_peers=seen.append, exclude=["10.0.0.9"])
        )
        try:
            await api.wait_watching("endpointslices.discovery.k8s.io")
            assert seen == [["10.0.0.1:9005"]]
            api.create("endpointslices", eps_slice("picker-def", "10.0.0.2"))
            await _until(lambda: len(seen) == 2)
            assert seen[-1] == ["10.0.0.1:9005", "10.0.0.2:9005"]
            api.delete("endpointslices", "picker-abc")
            await _until(lambda: len(seen) == 3)
            assert seen[-1] == ["10.0.0.2:9005"]
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        used = api.verbs("endpointslices.discovery.k8s.io")
        assert {"list", "watch"} <= used <= set(PEER_RULES[0].verbs)  # the chart's Role grants what is used


async def _until(check: Any, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():  # noqa: ASYNC110 - polls state of other tasks
            await asyncio.sleep(0.01)
