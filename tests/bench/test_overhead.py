"""``picker bench overhead``: real short runs with both load clients, the Go client's accounting against a real
picker, and the summary over rounds."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from picker import cli
from picker.bench import overhead, procs
from picker.bench.extproc_client import ExtProcClient
from picker.bench.overhead import Row, prompt_bodies, summarize
from picker.endpoints.store import EndpointStore
from tests.conftest import endpoint
from tests.extproc.conftest import make_store, picker

pytestmark = pytest.mark.slow


def _row(server: str, round_: int, rps: float, *, endpoints: int = 16, workers: int = 1, cpu: float = 1.0) -> Row:
    return Row(server, workers, endpoints, 4096, rps, 1.0, 2.0, 0, cpu, 0.4, round_)


def test_summary_takes_the_do_nothing_ratio_within_each_round() -> None:
    # Round 1 is a slow moment of the machine for both servers: its pair still gives the same ratio.
    rows = [
        _row("do-nothing", 0, 1000),
        _row("picker", 0, 800, cpu=1.2),
        _row("do-nothing", 1, 500),
        _row("picker", 1, 400, cpu=1.4),
        _row("do-nothing", 2, 1000),
        _row("picker", 2, 700, cpu=1.3),
    ]
    null, pick = summarize(rows)
    assert (null.server, null.rounds, null.rps, null.vs_null) == ("do-nothing", 3, 1000, None)
    assert (pick.rounds, pick.rps, pick.cpu_ms_per_request) == (3, 700, 1.3)
    # Medians of the rates would say 700 / 1000 = 70 %; the per-round ratios are 80 %, 80 % and 70 %.
    assert pick.vs_null == pytest.approx(0.8)
    assert pick.vs_null_range == pytest.approx((0.7, 0.8))
    assert (pick.cost_vs_least, pick.vs_one_worker) == (1.0, None)


def test_summary_compares_endpoints_and_workers_within_each_round() -> None:
    rows = []
    for round_, scale in enumerate((1.0, 0.5, 0.9)):  # the machine's speed in each round
        rows += [
            _row("do-nothing", round_, 1000 * scale),
            _row("picker", round_, 800 * scale),
            _row("picker", round_, 1200 * scale, workers=2),
            _row("picker", round_, 400 * scale, endpoints=1024),
            _row("picker", round_, 800 * scale, endpoints=1024, workers=2),
            _row("do-nothing", round_, 1300 * scale, workers=2),  # two processes on the port
        ]
    summaries = summarize(rows)
    nulls = {s.workers: s for s in summaries if s.server == "do-nothing"}
    assert nulls[2].vs_one_worker == pytest.approx(1.3)
    assert nulls[2].vs_null == pytest.approx(1.3)
    assert nulls[1].vs_one_worker is None
    assert nulls[1].vs_null is None
    by_config = {(s.workers, s.endpoints): s for s in summaries if s.server == "picker"}
    assert by_config[2, 16].vs_null == pytest.approx(1.2)  # against one do-nothing process, the goal's measure
    assert by_config[2, 16].vs_one_worker == pytest.approx(1.5)
    assert by_config[1, 1024].cost_vs_least == pytest.approx(2.0)
    assert by_config[2, 1024].cost_vs_least == pytest.approx(1.5)  # against 2 workers at 16 endpoints
    assert by_config[2, 1024].vs_one_worker == pytest.approx(2.0)
    assert by_config[1, 16].vs_one_worker is None


@pytest.mark.parametrize(
    ("client", "rounds", "fronts", "servers"),
    [
        ("go", 2, "native,grpc", ("do-nothing", "do-nothing/native", "picker", "picker/grpc")),
        ("python", 1, "native", ("do-nothing", "do-nothing/native", "picker")),
        ("go", 1, "grpc", ("do-nothing", "picker/grpc")),
    ],
)
def test_a_short_run_measures_every_server(
    client: str, rounds: int, fronts: str, servers: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "overhead.json"
    argv = ["bench", "overhead", "--endpoints", "2", "--sizes", "512", "--duration", "0.5", "--fronts", fronts]
    argv += ["--latency-requests", "20", "--concurrency", "4", "--connections", "2", "--repeat", str(rounds)]
    assert cli.main([*argv, "--client", client, "--json", str(out)]) == 0
    rows = [Row(**r) for r in json.loads(out.read_text())]
    expected = [(server, n) for n in range(rounds) for server in servers]
    assert [(r.server, r.round) for r in rows] == expected
    for r in rows:
        assert r.errors == 0
        assert r.rps > 0
        assert r.cpu_ms_per_request > 0  # the server's CPU was read from /proc
        assert r.client_cpu_ms_per_request > 0
    table = capsys.readouterr().out
    assert f"throughput client: {client}; {rounds} round(s)" in table
    assert sum(line.startswith("picker") for line in table.splitlines()) == sum(s.startswith("picker") for s in servers)


def test_the_go_client_counts_an_immediate_response_as_a_failure(tmp_path: Path) -> None:
    """Against a picker with no endpoints every request is answered 503: each one completes and fails."""
    binary = overhead.go_client()
    bodies = tmp_path / "bodies"
    bodies.write_bytes(b"\n".join(prompt_bodies(512, n=4)) + b"\n")

    async def drive(store: EndpointStore) -> dict[str, Any]:
        async with picker(store) as running:
            proc = await asyncio.create_subprocess_exec(
                binary,
                "-target",
                running.grpc_target,
                "-bodies",
                str(bodies),
                "-mode",
                "latency",
                "-requests",
                "10",
                "-warmup",
                "0",
                stdout=asyncio.subprocess.PIPE,
            )
            stdout, _ = await proc.communicate()
            assert proc.returncode == 0
            result: dict[str, Any] = json.loads(stdout)
            return result

    empty = asyncio.run(drive(make_store([])))
    assert (empty["completed"], empty["failed"]) == (10, 10)
    served = asyncio.run(drive(make_store([endpoint(1)])))
    assert (served["completed"], served["failed"]) == (10, 0)
    decisions = served["decisions_s"]
    assert len(decisions) == 10
    assert all(0 < d < 5 for d in decisions)


def test_the_go_client_fails_when_nothing_answers(tmp_path: Path) -> None:
    """No server on the port: the throughput pass exits 1 with the gRPC error, after its duration, not before."""
    bodies = tmp_path / "bodies"
    bodies.write_bytes(prompt_bodies(512, n=1)[0] + b"\n")
    port = procs.free_port()
    argv = [overhead.go_client(), "-target", f"127.0.0.1:{port}", "-bodies", str(bodies), "-duration", "300ms"]
    done = subprocess.run([*argv, "-warmup", "0"], capture_output=True, timeout=30, check=False)
    assert done.returncode == 1
    assert b"extproc-load:" in done.stderr
    assert b"Unavailable" in done.stderr or b"connection refused" in done.stderr
    assert done.stdout == b""


def test_the_go_client_gives_every_request_a_prompt_of_its_own_with_fresh(tmp_path: Path) -> None:
    """``-fresh``: each request's prompt starts with its own number; the rest of the body is the file's."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from picker.bench.nullproc import NullProcessor

    (body,) = prompt_bodies(512, n=1)
    bodies = tmp_path / "bodies"
    bodies.write_bytes(body + b"\n")
    seen: list[bytes] = []

    class Recording(NullProcessor):  # type: ignore[misc]
        async def Process(self, request_iterator: Any, context: Any) -> Any:
            async def recorded() -> Any:
                async for req in request_iterator:
                    if req.WhichOneof("request") == "request_body":
                        seen.append(req.request_body.body)
                    yield req

            async for resp in super().Process(recorded(), context):
                yield resp

    async def drive() -> dict[str, Any]:
        server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(Recording(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            argv = ["-target", f"127.0.0.1:{port}", "-bodies", str(bodies), "-mode", "latency", "-requests", "6"]
            proc = await asyncio.create_subprocess_exec(
                overhead.go_client(), *argv, "-warmup", "0", "-fresh", stdout=asyncio.subprocess.PIPE
            )
            stdout, _ = await proc.communicate()
            assert proc.returncode == 0
            result: dict[str, Any] = json.loads(stdout)
            return result
        finally:
            await server.stop(None)

    result = asyncio.run(drive())
    assert (result["completed"], result["failed"]) == (6, 0)
    assert len(set(seen)) == 6
    prompt = json.loads(body)["prompt"]
    numbers = []
    for sent in seen:
        decoded = json.loads(sent)
        number, rest = decoded["prompt"].split(" ", 1)
        assert rest == prompt
        assert number.startswith("g")
        numbers.append(int(number[1:]))
        assert {k: v for k, v in decoded.items() if k != "prompt"} == {
            k: v for k, v in json.loads(body).items() if k != "prompt"
        }
    assert sorted(numbers) == list(range(1, 7))


def test_fresh_needs_the_go_client(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "overhead", "--fresh", "--client", "python"]) == 2
    assert "--fresh needs --client go" in capsys.readouterr().err


def test_the_do_nothing_server_runs_several_processes_on_one_port_and_stops_them_all() -> None:
    import os
    import signal
    import sys
    import time

    port = procs.free_port()
    proc = subprocess.Popen([sys.executable, "-m", "picker.bench.nullproc", str(port), "3"])

    def children() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid:
                    found.append(int(entry))
        return found

    try:
        deadline = time.monotonic() + 30
        while len(children()) < 3 and time.monotonic() < deadline:  # 2 servers and the spawn resource tracker
            time.sleep(0.1)
        spawned = children()
        assert len(spawned) >= 2
        messages = overhead._messages(prompt_bodies(512, n=1))

        async def ask() -> int:
            client = ExtProcClient(f"127.0.0.1:{port}")
            try:
                return (await client.exchange(messages[0])).status
            finally:
                await client.close()

        assert asyncio.run(ask()) == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() for pid in spawned) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{pid}/stat").exists() for pid in spawned)


@pytest.mark.parametrize("flag", ["--scrape-interval", "--staleness"])
def test_a_bad_duration_is_a_usage_error_not_a_server_that_fails(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["bench", "overhead", flag, "2x"])
    assert exited.value.code == 2
    assert f"argument {flag}: '2x' is not a duration" in capsys.readouterr().err
