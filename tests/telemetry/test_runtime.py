"""Runtime gauges: leases, streams and asyncio tasks of every running picker, and the process_* gauges."""

from __future__ import annotations

from picker.telemetry import REGISTRY
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, picker
from tests.extproc.gateway import EnvoyFullDuplex, NginxShim, gateway


def value(name: str) -> float | None:
    return REGISTRY.get_sample_value(name)


async def test_runtime_gauges_follow_leases_and_go_away_with_picker() -> None:
    async with picker(make_store([endpoint(1)])) as running:
        assert value("picker_inflight_leases") == 0
        assert (value("picker_asyncio_tasks") or 0) > 0
        assert (value("process_open_fds") or 0) > 0
        assert (value("process_resident_memory_bytes") or 0) > 0
        async with gateway(NginxShim, running.grpc_target) as gw:  # no response phase: the lease is held
            await gw.request({":path": "/v1/completions"}, [b'{"model":"m","prompt":"p"}'])
        assert value("picker_inflight_leases") == 1
        assert running.inflight.open_leases == 1
        async with picker(make_store([endpoint(2)])) as second:  # two pickers in one process: summed
            async with gateway(NginxShim, second.grpc_target) as gw:
                await gw.request({":path": "/v1/completions"}, [b'{"model":"m","prompt":"p"}'])
            assert value("picker_inflight_leases") == 2
        assert value("picker_inflight_leases") == 1
        async with gateway(EnvoyFullDuplex, running.grpc_target) as gw:
            await gw.request({":path": "/v1/completions"}, [b'{"model":"m","prompt":"p"}'])
        assert value("picker_extproc_streams") == 0
    assert value("picker_inflight_leases") is None
    assert value("process_open_fds") is None
