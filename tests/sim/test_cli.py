"""``picker sim`` flags, and several servers in one process."""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import pytest

from picker.bench import stack as stack_procs
from picker.procutil import free_ports
from picker.sim import cli
from picker.sim.config import preset
from picker.sim.server import ServerConfig, SimServer


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    return parser.parse_args(list(argv))


def test_ports_forms() -> None:
    assert cli.ports(parse()) == [8000]
    assert cli.ports(parse("--port", "9000")) == [9000]
    assert cli.ports(parse("--ports", "8001,8002,8003")) == [8001, 8002, 8003]
    assert cli.ports(parse("--count", "3", "--base-port", "7000")) == [7000, 7001, 7002]
    for bad in (("--ports", "8001,8001"), ("--ports", "x"), ("--count", "0"), ("--ports", "70000")):
        with pytest.raises(ValueError, match=r"ports|count"):
            cli.ports(parse(*bad))


def test_hosts_flag() -> None:
    assert cli.hosts(parse("--ports", "8001,8002"), [8001, 8002]) == ["127.0.0.1", "127.0.0.1"]
    assert cli.hosts(parse("--hosts", "127.0.0.2, 127.0.0.3", "--port", "9000"), [9000]) == ["127.0.0.2", "127.0.0.3"]
    with pytest.raises(ValueError, match="distinct"):
        cli.hosts(parse("--hosts", "127.0.0.2,127.0.0.2"), [8000])
    with pytest.raises(ValueError, match="one --port"):
        cli.hosts(parse("--hosts", "127.0.0.2", "--ports", "8001,8002"), [8001, 8002])


async def test_hosts_serve_one_server_per_address_on_one_port() -> None:
    """``--hosts``: pods sharing a container port, each named by its address (``x-backend``)."""
    hosts = ["127.0.0.2", "127.0.0.3"]
    (port,) = free_ports(1, hosts=hosts)
    started: list[str] = []
    async with (
        stack_procs.sims(
            [port], num_gpu_blocks=None, seed=0, on_start=lambda c: started.append(c.name), hosts=hosts, preset="fast"
        ),
        aiohttp.ClientSession() as http,
    ):
        for host in hosts:
            body = {"prompt": "hi", "max_tokens": 2}
            async with http.post(f"http://{host}:{port}/v1/completions", json=body) as resp:
                assert resp.status == 200
                assert resp.headers["x-backend"] == f"sim-{host}:{port}"
    assert started == ["sims"]


def test_engine_config_from_flags() -> None:
    cfg = cli.engine_config(
        parse(
            "--preset", "cpu", "--model", "m", "--num-gpu-blocks", "99", "--no-enable-prefix-caching",
            "--lora-modules", "a=/path/a,b", "--max-loras", "2", "--tensor-parallel-size", "4",
        )
    )  # fmt: skip
    assert cfg.timing == preset("cpu").timing
    assert (cfg.model, cfg.num_gpu_blocks, cfg.enable_prefix_caching) == ("m", 99, False)
    assert (cfg.lora_adapters, cfg.max_loras) == (("a", "b"), 2)


def test_kv_event_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    assert cli.kv_events(parse(), 0) is None
    args = parse("--count", "3", "--kv-events-port", "5557", "--kv-events-replay-port", "6000", "--event-batch-size",
                 "4", "--use-vllm-map-event-format", "--host", "0.0.0.0", "--hash-seed", "42")  # fmt: skip
    opts = cli.kv_events(args, 2)
    assert opts is not None
    assert (opts.port, opts.replay_port, opts.batch_size, opts.map_format) == (5559, 6002, 4, True)
    assert opts.topic_host == "127.0.0.1"
    assert cli.engine_config(args).hash_seed == 42
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    central = cli.kv_events(parse("--zmq-endpoint", "tcp://epp:5557"), 1)
    assert central is not None
    assert (central.port, central.zmq_endpoint, central.topic_host) == (None, "tcp://epp:5557", "10.1.2.3")
    for bad in (("--kv-events-port", "1", "--zmq-endpoint", "tcp://x:1"), ("--kv-events-replay-port", "1")):
        with pytest.raises(ValueError, match=r"kv-events|zmq"):
            cli.kv_events(parse(*bad), 0)


def test_run_rejects_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.run(parse("--ports", "1,1")) == 2
    assert cli.run(parse("--failure-types", "nope")) == 2
    assert cli.run(parse("--hosts", "127.0.0.2", "--count", "2")) == 2
    assert "picker sim" in capsys.readouterr().err


async def test_serve_many_ports_in_one_process() -> None:
    stop = asyncio.Event()
    started: asyncio.Future[list[SimServer]] = asyncio.get_running_loop().create_future()
    configs = [ServerConfig(port=0, name=f"s{i}") for i in range(3)]
    task = asyncio.create_task(cli.serve(preset("fast"), configs, stop=stop, on_started=started.set_result))
    try:
        servers = await asyncio.wait_for(started, 5)
        assert len({s.port for s in servers}) == 3
        async with aiohttp.ClientSession() as http:
            for s in servers:
                async with http.post(f"{s.url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-backend"] == s.name
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
    assert all(s.engine.stats().steps > 0 for s in servers)  # each port has its own engine


async def test_serve_stops_after_duration() -> None:
    servers = await asyncio.wait_for(cli.serve(preset("fast"), [ServerConfig(port=0)], duration_s=0.1), 5)
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            async with http.get(f"{servers[0].url}/health"):
                pass


def test_kv_transfer_flags() -> None:
    assert cli.engine_config(parse()).kv_transfer_s_per_token == preset("h100-8b").kv_transfer_s_per_token
    by_link = cli.engine_config(parse("--kv-link-gbps", "25", "--kv-bytes-per-token", "65536"))
    assert by_link.kv_transfer_s_per_token == pytest.approx(65536 * 8 / 25e9)
    by_time = cli.engine_config(parse("--kv-cache-transfer-time-per-token", "0.5", "--kv-link-gbps", "25"))
    assert by_time.kv_transfer_s_per_token == pytest.approx(0.0005)  # the reference flag wins


def test_sidecar_flags() -> None:
    args = parse("--ports", "9001,9002", "--sidecar-ports", "0,9102", "--prefillers", "127.0.0.1:9001")
    [sidecar] = cli.sidecar_configs(args, cli.ports(args))
    assert (sidecar.port, sidecar.decoder_url) == (9102, "http://127.0.0.1:9002")
    assert sidecar.allowed_prefillers == frozenset({"127.0.0.1:9001"})
    any_prefiller = parse("--ports", "9001", "--sidecar-ports", "9101", "--allow-any-prefiller")
    assert cli.sidecar_configs(any_prefiller, [9001])[0].allowed_prefillers is None
    assert cli.sidecar_configs(parse(), [8000]) == []
    for bad in (
        ("--ports", "9001,9002", "--sidecar-ports", "9101", "--prefillers", "a:1"),  # one per port
        ("--ports", "9001", "--sidecar-ports", "9001", "--prefillers", "a:1"),  # a server's port
        ("--ports", "9001", "--sidecar-ports", "9101"),  # no allowlist
        ("--ports", "9001", "--sidecar-ports", "x", "--prefillers", "a:1"),
    ):
        args = parse(*bad)
        with pytest.raises(ValueError, match=r"sidecar|prefillers"):
            cli.sidecar_configs(args, cli.ports(args))
