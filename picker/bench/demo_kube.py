"""``picker demo --kube``: the demo's comparison with picker installed by the Helm chart into a local Kubernetes
control plane, finding its model servers through an InferencePool.

    picker demo --kube            # the control plane and the chart (~15 s), then the two phases of ``picker demo``
    picker demo --kube --short

All on loopback, with the control plane the ``kube`` tests use (picker/bench/cluster.py):

1. etcd, kube-apiserver, controller-manager, scheduler and kwok (a fake node, no kubelet) start, and the upstream
   InferencePool / InferenceObjective / InferenceModelRewrite CRDs from ``shared/third_party`` are applied;
2. real helm installs deploy/helm/picker into namespace ``picker-demo``: the InferencePool, picker's Deployment
   (rolled out on the kwok node; its container never runs), Service, ServiceAccount, Role and ConfigMap;
3. one model-server pod per simulated server is created on the kwok node with a loopback pod IP (127.0.0.2, .3,
   ...), where a ``picker sim`` server listens on the pool's target port;
4. phase 1: Envoy round robin over the pods' IPs as the API server lists them; phase 2: ``picker serve`` runs here
   with the arguments of the chart's Deployment (its ports swapped for free ones, the plugins file from its
   ConfigMap) and a token of the chart's ServiceAccount, so it finds the servers through the pool under the chart's
   RBAC; the load starts once picker's /metrics lists exactly the pool's pods.

Then the table of ``picker demo``. Every process is stopped and the control plane's folder removed at the end, on
an error and on Ctrl-C / SIGTERM. Without the control-plane tools it names the script that builds them and exits 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from picker.bench import cluster, demo, envoy, lab_report, procs
from picker.bench import stack as stack_procs
from picker.bench import workloads as wl
from picker.bench.load import LoadResult, run_load

__all__ = ["CHART", "NAMESPACE", "KubeSetup", "chart_argv", "install", "pod_hosts", "run"]

CHART = cluster.REPO / "deploy" / "helm" / "picker"
NAMESPACE = "picker-demo"
RELEASE = "demo"
EPP = f"{RELEASE}-epp"  # the chart's Deployment, ServiceAccount, ConfigMap
POD_LABELS = {"app": "picker-demo-sim"}
_PORT_FLAGS = ("--grpc-port", "--grpc-health-port", "--metrics-port")
_DISCOVERY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class KubeSetup:
    """What the demo installed: the pods (name → ``ip:port``) and the chart's ``picker serve`` made local."""

    port: int  # the pool's target port, where every pod's server listens
    hosts: list[str]  # the pods' IPs
    pods: dict[str, str]
    picker_argv: list[str]
    picker_env: dict[str, str]
    grpc_port: int
    metrics_port: int

    @property
    def backends(self) -> list[tuple[str, int]]:
        return [(address.rsplit(":", 1)[0], self.port) for address in self.pods.values()]


def pod_hosts(count: int) -> list[str]:
    """The pod IPs of ``count`` model servers: 127.0.0.2, 127.0.0.3, ... (loopback, never a routable address)."""
    if not 1 <= count <= 250:
        raise ValueError(f"--kube runs 1 to 250 servers, not {count}")
    return [f"127.0.0.{2 + i}" for i in range(count)]


def chart_argv(args: Sequence[str], ports: Mapping[str, int], config_dir: Path) -> list[str]:
    """The chart's ``picker serve`` arguments for a process on this machine: each port flag (``--grpc-port=9002``)
    set to the port in ``ports``, ``--config-file=/config/NAME`` read from ``config_dir``; every other flag as the
    chart rendered it."""
    out = []
    for arg in args:
        name, eq, value = arg.partition("=")
        if eq and name in ports:
            arg = f"{name}={ports[name]}"
        elif eq and name == "--config-file":
            arg = f"{name}={config_dir / Path(value).name}"
        out.append(arg)
    if not any(a.startswith("--pool-name=") for a in out):
        raise cluster.ClusterError(f"the chart's Deployment runs picker without --pool-name: {list(args)}")
    return out


def install(cp: cluster.ControlPlane, plan: demo.DemoPlan, root: Path) -> KubeSetup:
    """The chart, the model-server pods and the chart's ``picker serve`` command line (steps 2 and 3 above)."""
    hosts = pod_hosts(plan.sims)
    (port,) = procs.free_ports(1, hosts=hosts)
    cp.create_namespace(NAMESPACE)
    values = {
        "inferencePool": {"modelServers": {"matchLabels": POD_LABELS}, "targetPorts": [{"number": port}]},
        "inferenceExtension": {"flags": {"refresh-metrics-interval": plan.scrape_interval}},
    }
    values_path = root / "values.yaml"
    values_path.write_text(yaml.safe_dump(values))
    cp.helm("install", RELEASE, str(CHART), "-n", NAMESPACE, "-f", str(values_path))
    cp.kubectl("rollout", "status", f"deployment/{EPP}", "-n", NAMESPACE, "--timeout=60s", timeout_s=70)
    for i, host in enumerate(hosts):
        cp.fake_pod(NAMESPACE, f"model-server-{i + 1}", POD_LABELS, host)
    selector = ",".join(f"{k}={v}" for k, v in POD_LABELS.items())
    listed = cp.get("pods", "-n", NAMESPACE, "-l", selector)["items"]
    pods = {p["metadata"]["name"]: f"{p['status']['podIP']}:{port}" for p in listed}

    deployment = cp.get("deployment", EPP, "-n", NAMESPACE)
    spec = deployment["spec"]["template"]["spec"]
    config_dir = root / "config"
    config_dir.mkdir()
    for name, text in cp.get("configmap", EPP, "-n", NAMESPACE)["data"].items():
        (config_dir / name).write_text(text)
    grpc_port, health_port, metrics_port = procs.free_ports(3)
    ports = dict(zip(_PORT_FLAGS, (grpc_port, health_port, metrics_port), strict=True))
    kubeconfig = cp.token_kubeconfig(spec["serviceAccountName"], NAMESPACE, root / "picker.kubeconfig")
    argv = [*procs.picker_command(), "serve", *chart_argv(spec["containers"][0]["args"], ports, config_dir)]
    argv += ["--host", "127.0.0.1", "--kubeconfig", str(kubeconfig), "--grace-period", "0s"]
    argv += ["--termination-grace", "2s"]
    match = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    chart_pods = cp.get("pods", "-n", NAMESPACE, "-l", match)["items"]
    env = {"NAMESPACE": NAMESPACE, "POD_NAME": chart_pods[0]["metadata"]["name"] if chart_pods else EPP}
    return KubeSetup(port, hosts, pods, argv, env, grpc_port, metrics_port)


def run(args: argparse.Namespace) -> int:
    try:
        plan = demo.plan_from_args(args)
        pod_hosts(plan.sims)
        envoy_bin = envoy.envoy_binary()
        cluster.require_tools()
        cluster.crd_files()
    except (ValueError, envoy.EnvoyNotFound, cluster.ClusterError) as exc:
        print(f"picker demo: {exc}", file=sys.stderr)
        return 2
    workload = demo.workload_for(plan)
    print(
        f"picker demo --kube: a local control plane (Kubernetes {cluster.KUBE_VERSION[1:]}, kwok node), picker "
        f"installed by its Helm chart; {plan.sims} simulated h100-8b servers as pods ({plan.num_gpu_blocks} KV "
        f"blocks each), a real Envoy, shared-prefix workload ({plan.groups} system prompts of {plan.system_len} "
        f"tokens) at {plan.rate:g} req/s for {plan.duration_s:g} s per phase",
        flush=True,
    )
    started = time.perf_counter()
    children: list[procs.Child] = []
    stopped = procs.Interrupt()
    facts: dict[str, Any] = {}
    _sigterm_interrupts(stopped)
    try:
        with cluster.running_control_plane() as cp:
            facts["cluster_dir"] = str(cp.root)
            print(f"control plane up in {time.perf_counter() - started:.1f} s ({cp.server}, {cp.root})", flush=True)
            setup = install(cp, plan, cp.root)
            facts["pods"] = setup.pods
            facts["picker_argv"] = setup.picker_argv
            print(
                f"helm installed {RELEASE} into {NAMESPACE}: InferencePool {RELEASE}, Deployment {EPP} rolled out; "
                f"pods {', '.join(f'{n} {a}' for n, a in setup.pods.items())} "
                f"({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
            try:
                rows = asyncio.run(_main(plan, workload, envoy_bin, setup, children, stopped, facts))
            finally:
                _sigterm_interrupts(stopped)  # asyncio.run restored the default handler
    except (procs.ChildFailed, cluster.ClusterError, KeyboardInterrupt, asyncio.CancelledError) as exc:
        # By now every child is stopped and the control plane is down with its folder removed.
        return demo.ended_early(exc, stopped)
    return demo.report(
        args, plan, workload, rows, children, started, gateway_name="Envoy, picker from the chart", extra=lambda: facts
    )


def _sigterm_interrupts(stopped: procs.Interrupt) -> None:
    """SIGTERM outside the event loop raises KeyboardInterrupt (noted in ``stopped``), so the control plane's
    ``finally`` stops it as for Ctrl-C."""

    def on_sigterm(signum: int, _: FrameType | None) -> None:
        if stopped.signum is None:
            stopped.signum = signum
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)


async def _main(
    plan: demo.DemoPlan,
    workload: wl.Workload,
    envoy_bin: str,
    setup: KubeSetup,
    children: list[procs.Child],
    stopped: procs.Interrupt,
    facts: dict[str, Any],
) -> list[lab_report.Row]:
    procs.cancel_on_signals(stopped)
    on_start = procs.announce_into(children)
    rows = []
    for i, label in enumerate((demo.RR, demo.PICKER)):
        print(f"phase {i + 1}/2: {label}", flush=True)
        result, servers = await _phase(label, plan, workload, envoy_bin, setup, on_start, facts)
        rows.append(lab_report.make_row(label, result, servers))
    return rows


async def _phase(
    label: str,
    plan: demo.DemoPlan,
    workload: wl.Workload,
    envoy_bin: str,
    setup: KubeSetup,
    on_start: Callable[[procs.Child], None],
    facts: dict[str, Any],
) -> tuple[LoadResult, list[str]]:
    with_picker = label == demo.PICKER
    async with contextlib.AsyncExitStack() as stack:
        sims = await stack.enter_async_context(
            stack_procs.sims(
                [setup.port], num_gpu_blocks=plan.num_gpu_blocks, seed=plan.seed, on_start=on_start, hosts=setup.hosts
            )
        )
        children = [sims]
        if with_picker:
            env = dict(os.environ, PYTHONUNBUFFERED="1", **setup.picker_env)
            picker = await stack.enter_async_context(procs.spawn("picker", setup.picker_argv, env=env))
            on_start(picker)
            children.append(picker)
            await picker.wait_http(f"http://127.0.0.1:{setup.metrics_port}/metrics", 30.0)
            facts["discovered"] = await _discovered(picker, setup)
            facts["picker_log"] = _kube_log(picker.output(200_000))
            print(f"  picker found {len(facts['discovered'])} endpoints through InferencePool {RELEASE}:", flush=True)
            for line in facts["picker_log"]:
                print(f"    {line}", flush=True)
        listen, admin = procs.free_port(), procs.free_port()
        children.append(
            await demo.start_envoy(
                stack, listen, admin, setup.grpc_port, setup.backends, envoy_bin, with_picker, on_start
            )
        )
        load = run_load(f"http://127.0.0.1:{listen}", workload, demo.load_spec(plan))
        result = await stack_procs.watched(load, children)
        await stack_procs.stop_all(children)
    names = {f"sim-{address}": pod for pod, address in setup.pods.items()}
    stack_procs.name_servers(result.records, names)
    return result, list(names.values())


async def _discovered(picker: procs.Child, setup: KubeSetup) -> list[str]:
    """Wait until picker's endpoints (one ``picker_endpoint_metrics_age_seconds`` series each) are the pool's pods
    and it has scraped them; the endpoints. ``ChildFailed`` if that takes more than 30 s."""
    want = set(setup.pods.values())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _DISCOVERY_TIMEOUT_S
    got: set[str] = set()
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            picker.check()
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                url = f"http://127.0.0.1:{setup.metrics_port}/metrics"
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    got = _endpoints(await resp.text())
            if got == want:
                await asyncio.sleep(0.3)  # a few scrapes: picker has seen every server's metrics
                return sorted(got)
            await asyncio.sleep(0.1)
    raise procs.ChildFailed(
        f"picker did not find the pool's pods within {_DISCOVERY_TIMEOUT_S:g} s: it has {sorted(got)}, the pool "
        f"{sorted(want)}:\n{picker.output()}"
    )


def _endpoints(text: str) -> set[str]:
    return {
        sample.labels["endpoint"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "picker_endpoint_metrics_age_seconds"
    }


def _kube_log(output: str) -> list[str]:
    """picker's discovery log lines (``kubernetes: ...``), from its JSON log records."""
    out = []
    for line in output.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and str(record.get("msg", "")).startswith("kubernetes:"):
                out.append(str(record["msg"]))
    return out
