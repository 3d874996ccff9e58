"""The shipped example package: its scorers, strict typing, a pip install into a fresh venv that registers its
entry points, and a running ``picker serve`` that routes with it over ext_proc and explains it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import aiohttp
import grpc
import orjson
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client.parser import text_string_to_metric_families

from picker.bench.extproc_client import ExtProcClient, build_messages
from picker.endpoints.inflight import InflightTracker
from picker.plugins import CycleState, PluginContext
from picker.scheduling.config import load_config
from picker.scheduling.isolation import GuardedScorer
from picker.scheduling.scheduler import Scheduler
from tests.conftest import FakeClock, endpoint, request
from tests.e2e.procs import free_port, stop_process, wait_http
from tests.scheduling.helpers import HEAD, ids

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "picker-label-affinity"
EXPLAIN = "x-picker-explain"

CONFIG = (
    HEAD
    + """\
plugins:
- type: queue-scorer
- type: label-affinity-scorer
  parameters: {header: x-tenant, label: tenant}
- name: flaky
  type: tests.plugins.samples:FlakyScorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: label-affinity-scorer
    weight: 5
  - pluginRef: flaky
    weight: 0.5
"""
)


# -- the scorers, loaded by module path from the source tree -------------------------------------------------


@pytest.fixture
def example_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))


@pytest.mark.usefixtures("example_on_path")
def test_label_affinity_scorer() -> None:
    c = PluginContext(clock=FakeClock(), inflight=InflightTracker())
    text = HEAD + (
        "plugins:\n- type: picker_label_affinity:LabelAffinityScorer\n  parameters: {header: X-Tenant, label: tenant}\n"
    )
    scheduler = Scheduler(load_config(text, c), c)
    eps = [endpoint(i, labels={"tenant": t}) for i, t in ((1, "a"), (2, "b"), (3, "c"))]
    assert ids(scheduler.schedule(request(headers={"x-tenant": "c"}), eps).targets) == [3]
    scores = scheduler.schedule(request(), eps).runs[0].scores["picker_label_affinity:LabelAffinityScorer"]
    assert set(scores.values()) == {0.0}  # no header: no preference


@pytest.mark.usefixtures("example_on_path")
def test_tpot_trend_scorer_avoids_a_slowing_endpoint_and_distrusts_stale_metrics() -> None:
    clock, tracker = FakeClock(), InflightTracker()
    c = PluginContext(clock=clock, inflight=tracker)
    text = HEAD + "plugins:\n- type: picker_label_affinity:TpotTrendScorer\n  parameters: {maxMetricsAgeS: 5}\n"
    config = load_config(text, c)
    scorer = config.plugins["picker_label_affinity:TpotTrendScorer"]
    assert isinstance(scorer, GuardedScorer)
    eps = [endpoint(1, updated_at=clock.now), endpoint(2, updated_at=clock.now), endpoint(3, updated_at=clock.now - 9)]
    for key in (eps[0].key, eps[1].key):
        tracker.observe(key, tpot_s=0.02)
    assert scorer.guarded_score(request(), eps, CycleState()) == [1.0, 1.0, 0.5]
    for _ in range(10):
        tracker.observe(eps[1].key, tpot_s=0.06)  # endpoint 2 gets three times slower
        scores = scorer.guarded_score(request(), eps, CycleState())
    assert isinstance(scores, list)
    assert scores[0] == 1.0
    assert 0.3 < scores[1] < 0.9
    assert scores[2] == 0.5  # metrics 9 s old > 5 s
    scorer.plugin.endpoints_changed(frozenset({eps[0].key}))  # type: ignore[attr-defined]
    assert set(scorer.plugin.slow_tpot_s) == {eps[0].key}  # type: ignore[attr-defined]


def test_example_package_type_checks_strictly() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", str(EXAMPLE / "src" / "picker_label_affinity")],
        cwd=ROOT,  # mypy finds picker here (the editable install's import hook is invisible to it)
        env=dict(os.environ, MYPYPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# -- installed with pip into a fresh venv -------------------------------------------------------------------


LOAD_BY_ENTRY_POINT = """
import json, random
from picker.endpoints.inflight import InflightTracker
from picker.endpoints.model import Endpoint
from picker.plugins import CycleState, PluginContext
from picker.scheduling import external
from picker.scheduling.config import load_config
from picker.scheduling.isolation import GuardedScorer
from picker.scheduling.scheduler import Scheduler
from picker.request.model import ApiKind, InferenceRequest

text = '''apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: label-affinity-scorer
  parameters: {header: x-tenant, label: tenant}
- type: tpot-trend-scorer
'''
ctx = PluginContext(clock=lambda: 1.0, inflight=InflightTracker(), rng=random.Random(1))
config = load_config(text, ctx)
eps = [Endpoint.create("10.0.0.%d" % i, 8000, labels={"tenant": t}) for i, t in ((1, "a"), (2, "b"))]
req = InferenceRequest("r", ApiKind.COMPLETIONS, "m", "m", headers={"x-tenant": "b"})
result = Scheduler(config, ctx).schedule(req, eps)
print(json.dumps({
    "installed": external.installed_types(),
    "wrapped": {n: [type(p).__name__, type(p.plugin).__module__] for n, p in config.plugins.items()},
    "target": result.targets[0].key,
    "scores": result.explain()["profiles"][0]["scores"],
}))
"""


def test_pip_installed_example_registers_its_types(plugin_python: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [plugin_python, "-c", LOAD_BY_ENTRY_POINT], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert {"label-affinity-scorer", "tpot-trend-scorer"} <= set(out["installed"])
    assert out["wrapped"] == {
        "label-affinity-scorer": ["GuardedScorer", "picker_label_affinity.affinity"],
        "tpot-trend-scorer": ["GuardedScorer", "picker_label_affinity.tpot"],
    }
    assert out["target"] == "10.0.0.2:8000"
    assert out["scores"]["label-affinity-scorer"] == {"10.0.0.1:8000": 0.0, "10.0.0.2:8000": 1.0}


def test_the_example_is_not_importable_without_installing(tmp_path: Path) -> None:
    """The entry-point test above would prove nothing if the source tree were on the path anyway."""
    done = subprocess.run(
        [sys.executable, "-c", "import picker_label_affinity"], cwd=tmp_path, capture_output=True, timeout=60
    )
    assert done.returncode != 0


# -- end to end: picker serve, ext_proc ------------------------------------------------------------------------


async def _routed(target: str, headers: Mapping[str, str], body: bytes) -> tuple[str, dict[str, str]]:
    """One request through ext_proc: the destination and every header picker set on the request."""
    async with grpc.aio.insecure_channel(target) as channel:
        call = pb_grpc.ExternalProcessorStub(channel).Process()
        for message in build_messages(headers, body):
            await call.write(message)
        await call.done_writing()
        while True:
            resp = await asyncio.wait_for(call.read(), 10)
            assert resp is not grpc.aio.EOF, "stream ended without a headers response"
            if resp.WhichOneof("response") == "request_headers":
                mutation = resp.request_headers.response.header_mutation
                set_headers = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
                call.cancel()
                return set_headers.get("x-gateway-destination-endpoint", ""), set_headers
            assert resp.WhichOneof("response") != "immediate_response", resp


async def _metrics(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        text = await resp.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@pytest.fixture
async def served(plugin_python: Path, tmp_path: Path) -> AsyncIterator[tuple[str, int, dict[str, str]]]:
    """``picker serve`` from the plugin venv; yields (grpc target, metrics port, tenant -> endpoint key)."""
    tenants = {t: f"127.0.0.1:{free_port()}" for t in ("a", "b", "c")}  # nothing listens: scrapes fail, fine
    endpoints = [
        {"address": "127.0.0.1", "port": int(key.rsplit(":", 1)[1]), "labels": {"tenant": t}}
        for t, key in tenants.items()
    ]
    (tmp_path / "endpoints.json").write_text(json.dumps(endpoints))
    grpc_port, metrics_port = free_port(), free_port()
    args = ["--secure-serving=false", "--host", "127.0.0.1", "--grpc-port", str(grpc_port)]
    args += ["--grpc-health-port", str(free_port()), "--metrics-port", str(metrics_port)]
    args += ["--endpoints-file", str(tmp_path / "endpoints.json"), "--refresh-metrics-interval", "1s"]
    args += ["--config-text", CONFIG, "--explain-header", "--grace-period", "0s"]
    with tempfile.TemporaryFile() as log:
        # cwd: the repository, so `tests.plugins.samples:FlakyScorer` imports by module path; the example
        # package itself is importable only from the venv it was installed into.
        proc = await asyncio.create_subprocess_exec(
            str(plugin_python), "-m", "picker.cli", "serve", *args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            await wait_http(f"http://127.0.0.1:{metrics_port}/metrics", proc=proc)
            yield f"127.0.0.1:{grpc_port}", metrics_port, tenants
        except BaseException:
            await stop_process(proc)
            log.seek(0)
            sys.stderr.write("picker output:\n" + log.read()[-8000:].decode(errors="replace"))
            raise
        finally:
            await stop_process(proc)


BODY = orjson.dumps({"model": "m", "prompt": "hello, plugins"})


def _headers(**extra: str) -> dict[str, str]:
    return {":method": "POST", ":path": "/v1/completions", "content-type": "application/json", **extra}


async def test_serve_routes_with_the_installed_plugin(served: tuple[str, int, dict[str, str]]) -> None:
    target, metrics_port, tenants = served
    client = ExtProcClient(target)
    try:
        for tenant in ("b", "a", "c"):
            exchange = await client.exchange(build_messages(_headers(**{"x-tenant": tenant}), BODY))
            assert (exchange.status, exchange.destination) == (200, tenants[tenant])
    finally:
        await client.close()

    destination, headers = await _routed(target, _headers(**{"x-tenant": "b"}), BODY)
    assert destination == tenants["b"]
    (profile,) = orjson.loads(headers[EXPLAIN])["profiles"]
    assert profile["scores"]["label-affinity-scorer"] == {tenants["a"]: 0.0, tenants["b"]: 1.0, tenants["c"]: 0.0}
    assert profile["weights"]["label-affinity-scorer"] == 5.0
    assert "dropped" not in profile

    # A user plugin that raises: the request is still routed (by the others), the drop explained and counted.
    destination, headers = await _routed(target, _headers(**{"x-tenant": "a", "x-fail": "1"}), BODY)
    assert destination == tenants["a"]
    (profile,) = orjson.loads(headers[EXPLAIN])["profiles"]
    assert profile["dropped"] == {"flaky": "error"}

    samples = await _metrics(metrics_port)
    flaky = (("plugin_name", "flaky"), ("plugin_type", "tests.plugins.samples:FlakyScorer"))
    assert samples[("picker_plugin_errors_total", (*flaky, ("reason", "error")))] == 1.0
    assert samples[("picker_plugin_errors_total", (*flaky, ("reason", "budget")))] == 0.0
    # User plugins' latency is in the reference per-plugin histogram, like the built-ins'.
    scorer = (("extension_point", "Scorer"), ("plugin_name", "label-affinity-scorer"))
    timed = ("inference_extension_plugin_duration_seconds_count", (*scorer, ("plugin_type", "label-affinity-scorer")))
    assert samples[timed] == 5.0


# -- the example in the policy lab -------------------------------------------------------------------------------

LAB_CONFIG = (
    HEAD
    + """\
plugins:
- type: latency-scorer
- type: prefix-cache-scorer
- type: picker_label_affinity:TpotTrendScorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-scorer
    weight: 1
  - pluginRef: picker_label_affinity:TpotTrendScorer
    weight: 1
"""
)


@pytest.mark.usefixtures("example_on_path")
def test_example_scorer_runs_in_the_policy_lab_with_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What docs/plugins.md tells an author to do before deploying: measure the idea against the default."""
    from picker import cli

    cfg = tmp_path / "with-tpot-trend.yaml"
    cfg.write_text(LAB_CONFIG)
    out = tmp_path / "lab.json"
    argv = ["bench", "lab", "--workload", "shared-prefix", "--engines", "4", "--rate", "10", "--requests", "150"]
    assert cli.main([*argv, "--policies", "rr,picker", "--config", str(cfg), "--seed", "3", "--json", str(out)]) == 0
    report = capsys.readouterr().out
    assert f"config:{cfg}" in report
    doc = json.loads(out.read_text())
    assert doc["lab"]["policies"] == ["rr", "picker", f"config:{cfg}"]
    runs = {run["label"]: run for run in doc["runs"]}
    assert set(runs) == {"rr", "picker", f"config:{cfg}"}  # the user plugin's configuration ran beside the others
    assert f"config:{cfg}" in report  # and is in the printed table
