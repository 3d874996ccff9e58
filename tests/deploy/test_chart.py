"""The Helm chart, rendered by the real helm and validated offline by kubeconform.

Covers: lint; a matrix of values (defaults, leader election, monitoring, no pool, each engine, PDB, TLS, custom
plugins config); every object against strict Kubernetes schemas (and our InferencePool v1 / ServiceMonitor ones);
the InferencePool v1 rules; container flags, probes, security context; RBAC equal to picker/discovery/rbac.py;
values the schema or the templates must reject, with a readable message; NOTES.txt.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from picker.discovery.rbac import (
    INFERENCE_GROUP,
    INFERENCE_X_GROUP,
    LEADER_ELECTION_RULES,
    METRICS_AUTH_RULES,
    PEER_RULES,
    REQUIRED_RULES,
    rules_for,
)

from ._tools import CHART, NAMESPACE, RELEASE, Rendered, kubeconform, render, run, template, tool

LABELS = {"app": "vllm-llama3-8b"}
BASE: dict[str, Any] = {"inferencePool": {"modelServers": {"matchLabels": LABELS}}}
V1ALPHA2 = {"inferencePool": {"apiVersion": "inference.networking.x-k8s.io/v1alpha2"}}
ENGINES = ("vllm", "sglang", "triton-tensorrt-llm", "trtllm-serve")

# `picker serve` flags (picker/app.py). Anything else in the args is a chart bug — e.g. the reference chart's
# deprecated per-metric-name flags (reference defect 14).
PICKER_FLAGS = {
    "tracing",
    "workers",
    "grpc-port",
    "grpc-health-port",
    "metrics-port",
    "secure-serving",
    "metrics-endpoint-auth",
    "cert-path",
    "config-file",
    "config-text",
    "refresh-metrics-interval",
    "metrics-staleness-threshold",
    "disable-endpoint-subset-filter",
    "zap-encoder",
    "v",
    "endpoints",
    "pool-name",
    "pool-namespace",
    "pool-group",
    "endpoint-selector",
    "endpoint-target-ports",
    "ha-enable-leader-election",
    "peer-service",
    "peer-port",
}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merged(out[key], value)
            else:
                out[key] = value
    return out


def ie(**values: Any) -> dict[str, Any]:
    return {"inferenceExtension": values}


ACTIVE_ACTIVE = ie(
    replicas=3,
    activeActive=True,
    certSecretName="picker-tls",
    strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
    podDisruptionBudget={"enabled": True},
)


CASES: dict[str, dict[str, Any]] = {
    "defaults": BASE,
    "leader-election": merged(BASE, ie(replicas=2)),
    "monitoring": merged(BASE, ie(monitoring={"prometheus": {"enabled": True, "labels": {"release": "prom"}}})),
    "metrics-auth": merged(BASE, ie(monitoring={"prometheus": {"auth": {"enabled": True}}})),
    "pool-off": {"inferencePool": {"create": False, "name": "shared-pool"}},
    "pool-v1alpha2": merged(BASE, V1ALPHA2),
    "rolling-update": merged(
        BASE, ie(strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    ),
    "rolling-update-ha": merged(
        BASE,
        ie(replicas=2, strategy={"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 2, "maxUnavailable": "100%"}}),
    ),
    "pool-off-v1alpha2-leader": merged(
        {"inferencePool": {"create": False, "name": "shared-pool"}}, V1ALPHA2, ie(replicas=2)
    ),
    "pdb": merged(BASE, ie(podDisruptionBudget={"enabled": True, "minAvailable": 0})),
    "pdb-max-unavailable": merged(BASE, ie(podDisruptionBudget={"enabled": True, "maxUnavailable": 1})),
    "tls-secret": merged(BASE, ie(certSecretName="picker-tls")),
    "tracing": merged(BASE, ie(tracing={"enabled": True, "otelExporterEndpoint": "http://collector:4317"})),
    "active-active": merged(BASE, ACTIVE_ACTIVE),
    "plaintext": merged(BASE, ie(secureServing=False, failureMode="FailClose")),
    "workers": merged(BASE, ie(workers=4, resources={"limits": {"cpu": "4", "memory": "4Gi"}})),
    "multi-port-h2c": merged(
        BASE,
        {"inferencePool": {"targetPorts": [{"number": 8000}, {"number": 8001}], "appProtocol": "kubernetes.io/h2c"}},
    ),
    **{f"engine-{e}": merged(BASE, {"inferencePool": {"modelServerType": e}}) for e in ENGINES},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered]:
    """Every case rendered once for the module."""
    tmp = tmp_path_factory.mktemp("render")
    return {name: render(tmp, values) for name, values in CASES.items()}


def test_helm_lint_strict() -> None:
    proc = run(
        [
            tool("helm"),
            "lint",
            "--strict",
            CHART,
            "--kube-version",
            "1.34.0",
            "--set",
            "inferencePool.modelServers.matchLabels.app=vllm",
        ]
    )
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout


def test_helm_is_the_pinned_version() -> None:
    go = shutil.which("go") or "/usr/local/go/bin/go"  # install-tools.sh needed go to build helm at all
    proc = run([go, "version", "-m", tool("helm")])
    assert "helm.sh/helm/v3\tv3.19.0" in proc.stdout


@pytest.mark.parametrize("case", list(CASES))
def test_every_object_passes_strict_kubernetes_schemas(
    case: str, rendered: dict[str, Rendered], tmp_path: Path
) -> None:
    results = kubeconform(rendered[case].text, tmp_path)
    assert len(results) == len(rendered[case].objects)


def test_objects_rendered_per_case(rendered: dict[str, Rendered]) -> None:
    base = {"ServiceAccount", "ConfigMap", "Role", "RoleBinding", "Service", "Deployment", "InferencePool"}
    assert set(rendered["defaults"].kinds()) == base
    assert set(rendered["monitoring"].kinds()) == base | {"ServiceMonitor"}
    assert set(rendered["pdb"].kinds()) == base | {"PodDisruptionBudget"}
    assert set(rendered["pdb-max-unavailable"].kinds()) == base | {"PodDisruptionBudget"}
    assert set(rendered["pool-off"].kinds()) == base - {"InferencePool"}


def pool_group(case: str) -> str:
    return INFERENCE_X_GROUP if "v1alpha2" in case else INFERENCE_GROUP


@pytest.mark.parametrize("case", [c for c in CASES if "pool-off" not in c and "v1alpha2" not in c])
def test_inference_pool_follows_v1_rules(case: str, rendered: dict[str, Rendered]) -> None:
    out = rendered[case]
    pool = out.one("InferencePool")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["metadata"] == {**pool["metadata"], "name": RELEASE, "namespace": NAMESPACE}
    spec = pool["spec"]
    assert spec["selector"]["matchLabels"] == LABELS
    assert 1 <= len(spec["selector"]["matchLabels"]) <= 64
    ports = [p["number"] for p in spec["targetPorts"]]
    assert 1 <= len(ports) <= 8
    assert len(set(ports)) == len(ports)
    assert all(isinstance(p, int) and 1 <= p <= 65535 for p in ports)
    assert spec.get("appProtocol", "http") in ("http", "kubernetes.io/h2c")
    ref = spec["endpointPickerRef"]
    assert ref["kind"] == "Service"
    assert ref["group"] == ""
    assert ref["failureMode"] in ("FailOpen", "FailClose")
    # The ref resolves: the rendered Service of that name serves ext_proc on that port.
    service = out.one("Service")
    assert ref["name"] == service["metadata"]["name"] == f"{RELEASE}-epp"
    ext_proc = next(p for p in service["spec"]["ports"] if p["name"] == "grpc-ext-proc")
    assert ref["port"]["number"] == ext_proc["port"] == 9002


def test_v1alpha2_pool_has_the_older_shape(rendered: dict[str, Rendered]) -> None:
    out = rendered["pool-v1alpha2"]
    pool = out.one("InferencePool")
    assert pool["apiVersion"] == "inference.networking.x-k8s.io/v1alpha2"
    assert pool["spec"] == {
        "targetPortNumber": 8000,
        "selector": LABELS,
        "extensionRef": {
            "group": "",
            "kind": "Service",
            "name": f"{RELEASE}-epp",
            "portNumber": 9002,
            "failureMode": "FailOpen",
        },
    }
    assert out.args()["pool-group"] == INFERENCE_X_GROUP
    # picker reads this shape (the discovery parser), with the same selector and port.
    from picker.discovery.kubeobjects import parse_pool

    spec = parse_pool(pool)
    assert (dict(spec.selector), spec.target_ports) == (LABELS, (8000,))


def test_pool_values_carry_through(rendered: dict[str, Rendered]) -> None:
    assert rendered["defaults"].one("InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"
    assert rendered["plaintext"].one("InferencePool")["spec"]["endpointPickerRef"]["failureMode"] == "FailClose"
    multi = rendered["multi-port-h2c"].one("InferencePool")["spec"]
    assert multi["targetPorts"] == [{"number": 8000}, {"number": 8001}]
    assert multi["appProtocol"] == "kubernetes.io/h2c"
    assert "appProtocol" not in rendered["defaults"].one("InferencePool")["spec"]


@pytest.mark.parametrize("case", list(CASES))
def test_container_args_are_picker_flags(case: str, rendered: dict[str, Rendered]) -> None:
    out = rendered[case]
    args = out.args()
    assert set(args) <= PICKER_FLAGS, f"unknown flags {set(args) - PICKER_FLAGS}"
    pool_name = "shared-pool" if "pool-off" in case else RELEASE
    assert args["pool-name"] == pool_name
    assert args["pool-namespace"] == NAMESPACE
    assert args["pool-group"] == pool_group(case)
    assert (args["grpc-port"], args["grpc-health-port"], args["metrics-port"]) == ("9002", "9003", "9090")
    assert args["zap-encoder"] == "json"
    # The config file picker loads is a key of the mounted ConfigMap.
    config_file = args["config-file"]
    assert config_file is not None
    assert config_file.startswith("/config/")
    assert config_file.removeprefix("/config/") in out.one("ConfigMap")["data"]
    leader = out.one("Deployment")["spec"]["replicas"] > 1 and case != "active-active"
    assert ("ha-enable-leader-election" in args) == leader
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in out.container()["env"] if "valueFrom" in e}
    pod_ip = {"POD_IP": "status.podIP"} if case == "active-active" else {}
    assert {k: v for k, v in env.items() if not k.startswith("OTEL_")} == {
        "NAMESPACE": "metadata.namespace",
        "POD_NAME": "metadata.name",
        **pod_ip,
    }
    assert (case == "tracing") == any(k.startswith("OTEL_") for k in env)


def test_serving_tls_flags(rendered: dict[str, Rendered]) -> None:
    assert "secure-serving" not in rendered["defaults"].args()  # picker's default: TLS, self-signed
    assert "cert-path" not in rendered["defaults"].args()
    assert rendered["plaintext"].args()["secure-serving"] == "false"
    out = rendered["tls-secret"]
    assert out.args()["cert-path"] == "/etc/picker/tls"
    mounts = {m["name"]: m["mountPath"] for m in out.container()["volumeMounts"]}
    volumes = {v["name"]: v for v in out.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert mounts["tls"] == "/etc/picker/tls"
    assert volumes["tls"]["secret"]["secretName"] == "picker-tls"


def test_extra_flags_render_once_and_typed(tmp_path: Path) -> None:
    flags = {
        "refresh-metrics-interval": "100ms",
        "metrics-staleness-threshold": "2s",
        "disable-endpoint-subset-filter": True,
        "v": 3,
        "config-text-unused-number": 1000000,  # YAML numbers reach templates as float64: must not print 1e+06
    }
    args = render(tmp_path, merged(BASE, ie(flags=flags))).args()
    assert args["refresh-metrics-interval"] == "100ms"
    assert args["metrics-staleness-threshold"] == "2s"
    assert args["disable-endpoint-subset-filter"] is None
    assert args["v"] == "3"
    assert args["config-text-unused-number"] == "1000000"


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_reaches_picker_through_the_plugins_config(engine: str, rendered: dict[str, Rendered]) -> None:
    out = rendered[f"engine-{engine}"]
    for name in ("default-plugins.yaml", "reference-plugins.yaml"):
        config = yaml.safe_load(out.one("ConfigMap")["data"][name])
        assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
        assert config["kind"] == "EndpointPickerConfig"
        plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
        assert plugins["core-metrics-extractor"] == {"defaultEngine": engine}
        (profile,) = config["schedulingProfiles"]
        for ref in profile["plugins"]:
            assert ref["pluginRef"] in plugins
    # No per-metric-name flags (the reference's --total-queued-requests-metric etc.): the engine selects them.
    assert not [name for name in out.args() if name.endswith("-metric")]


def test_the_charts_default_is_pickers_built_in_default(rendered: dict[str, Rendered]) -> None:
    """One source: the chart renders picker's own default file, the engine set on its metrics extractor."""
    from picker.scheduling.config import DEFAULT_CONFIG_TEXT

    out = rendered["defaults"]
    assert out.args()["config-file"] == "/config/default-plugins.yaml"
    chart = yaml.safe_load(out.one("ConfigMap")["data"]["default-plugins.yaml"])
    built_in = yaml.safe_load(DEFAULT_CONFIG_TEXT)
    for plugin in built_in["plugins"]:
        if plugin["type"] == "core-metrics-extractor":
            plugin["parameters"] = {"defaultEngine": "vllm"}
    assert chart == built_in


def test_the_reference_profile_is_one_value_away(tmp_path: Path) -> None:
    out = render(tmp_path, merged(BASE, ie(pluginsConfigFile="reference-plugins.yaml")))
    assert out.args()["config-file"] == "/config/reference-plugins.yaml"
    config = yaml.safe_load(out.one("ConfigMap")["data"]["reference-plugins.yaml"])
    (profile,) = config["schedulingProfiles"]
    weights = {p["pluginRef"]: p["weight"] for p in profile["plugins"]}
    assert weights == {"queue-scorer": 2, "kv-cache-utilization-scorer": 2, "prefix-cache-scorer": 3}


def test_custom_plugins_config_is_mounted_and_selected(tmp_path: Path) -> None:
    custom = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: queue-scorer\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
    )
    values = merged(BASE, ie(pluginsConfigFile="mine.yaml", pluginsCustomConfig={"mine.yaml": custom}))
    out = render(tmp_path, values)
    assert out.args()["config-file"] == "/config/mine.yaml"
    assert out.one("ConfigMap")["data"]["mine.yaml"] == custom
    assert "default-plugins.yaml" in out.one("ConfigMap")["data"]


def test_config_change_rolls_the_pods(tmp_path: Path, rendered: dict[str, Rendered]) -> None:
    def checksum(out: Rendered) -> str:
        return str(out.one("Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum(rendered["engine-vllm"]) == checksum(rendered["defaults"])
    assert checksum(rendered["engine-sglang"]) != checksum(rendered["defaults"])


@pytest.mark.parametrize("case", ["defaults", "leader-election"])
def test_probes_use_grpc_health_on_9003(case: str, rendered: dict[str, Rendered]) -> None:
    container = rendered[case].container()
    live, ready = container["livenessProbe"], container["readinessProbe"]
    assert live["grpc"]["port"] == ready["grpc"]["port"] == 9003
    if case == "leader-election":
        assert (live["grpc"]["service"], ready["grpc"]["service"]) == ("liveness", "readiness")
    else:
        assert live["grpc"]["service"] == ready["grpc"]["service"] == "inference-extension"
    assert ready["periodSeconds"] == 2
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc-ext-proc": 9002, "grpc-health": 9003, "http-metrics": 9090}


def test_service_ports(rendered: dict[str, Rendered]) -> None:
    service = rendered["defaults"].one("Service")
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {
        "grpc-ext-proc": (9002, "grpc-ext-proc"),
        "grpc-health": (9003, "grpc-health"),
        "http-metrics": (9090, "http-metrics"),
    }
    pod_labels = rendered["defaults"].one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    # The EPP pods must never be picked up as model servers by the pool's selector.
    assert not LABELS.items() <= pod_labels.items()


def test_deployment_rollout_settings(rendered: dict[str, Rendered]) -> None:
    spec = rendered["leader-election"].one("Deployment")["spec"]
    assert spec["strategy"] == {"type": "Recreate"}
    surge = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert rendered["rolling-update"].one("Deployment")["spec"]["strategy"] == surge
    ha = rendered["rolling-update-ha"].one("Deployment")["spec"]["strategy"]
    assert ha["rollingUpdate"]["maxUnavailable"] == "100%"
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] == 130
    assert spec["replicas"] == 2
    resources = rendered["defaults"].container()["resources"]
    assert resources["requests"]["cpu"]
    assert resources["limits"]["memory"]


@pytest.mark.parametrize("case", list(CASES))
def test_security_context(case: str, rendered: dict[str, Rendered]) -> None:
    out = rendered[case]
    pod = out.one("Deployment")["spec"]["template"]["spec"]
    sc = out.container()["securityContext"]
    assert sc["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert isinstance(sc["runAsUser"], int)
    assert sc["runAsUser"] > 0
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    tmp_mounts = [m for m in out.container()["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp_mounts) == 1
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[tmp_mounts[0]["name"]]


def _rule_keys(role: dict[str, Any]) -> set[tuple[str, str, frozenset[str]]]:
    keys = set()
    for rule in role["rules"]:
        assert "nonResourceURLs" not in rule
        assert "resourceNames" not in rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                keys.add((group, resource, frozenset(rule["verbs"])))
    return keys


@pytest.mark.parametrize(
    ("case", "leader"),
    [("defaults", False), ("leader-election", True), ("pool-v1alpha2", False), ("pool-off-v1alpha2-leader", True)],
)
def test_rbac_equals_what_picker_declares(case: str, leader: bool, rendered: dict[str, Rendered]) -> None:
    out = rendered[case]
    role = out.one("Role")
    assert _rule_keys(role) == {r.key() for r in rules_for(leader_election=leader, pool_group=pool_group(case))}
    binding = out.one("RoleBinding")
    account = out.one("ServiceAccount")["metadata"]["name"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert out.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account
    assert not out.all("ClusterRole")
    assert not out.all("ClusterRoleBinding")


def test_metrics_auth_adds_exactly_the_review_rules_cluster_wide(rendered: dict[str, Rendered]) -> None:
    out = rendered["metrics-auth"]
    assert "--metrics-endpoint-auth" in out.container()["args"]
    assert "--metrics-endpoint-auth" not in rendered["defaults"].container()["args"]
    role = out.one("ClusterRole")
    assert _rule_keys(role) == {r.key() for r in METRICS_AUTH_RULES}
    binding = out.one("ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = out.one("ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert _rule_keys(out.one("Role")) == {r.key() for r in rules_for(leader_election=False)}


def test_active_active_mode(rendered: dict[str, Rendered]) -> None:
    out = rendered["active-active"]
    deployment = out.one("Deployment")
    assert deployment["spec"]["replicas"] == 3
    args = out.container()["args"]
    assert "--ha-enable-leader-election" not in args
    assert f"--peer-service={RELEASE}-epp" in args
    assert "--peer-port=9005" in args
    assert "--cert-path=/etc/picker/tls" in args
    # every replica is Ready: the probes ask for the plain service, not the leader's readiness
    container = out.container()
    assert container["readinessProbe"]["grpc"]["service"] == "inference-extension"
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["grpc-peers"] == 9005
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # the Service whose EndpointSlices name the peers is the one the chart renders, selecting these pods
    service = out.one("Service")
    assert service["metadata"]["name"] == f"{RELEASE}-epp"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert _rule_keys(out.one("Role")) == {r.key() for r in rules_for(leader_election=False, peers=True)}
    assert {r.resource for r in PEER_RULES} == {"endpointslices"}
    pdb = out.one("PodDisruptionBudget")["spec"]
    assert pdb["minAvailable"] == 1  # one replica keeps serving through any voluntary disruption
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


def test_declared_rbac_is_read_only_without_leader_election() -> None:
    assert all(set(r.verbs) == {"get", "watch", "list"} for r in REQUIRED_RULES)
    assert {r.resource for r in LEADER_ELECTION_RULES} == {"leases", "events"}


def test_service_monitor_scrapes_the_metrics_port(rendered: dict[str, Rendered]) -> None:
    out = rendered["monitoring"]
    monitor = out.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = out.one("Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("http-metrics", "/metrics", "10s")


def test_tracing_renders_the_flag_and_otel_environment(rendered: dict[str, Rendered]) -> None:
    assert "tracing" not in rendered["defaults"].args()  # picker's default: off
    out = rendered["tracing"]
    assert out.args()["tracing"] == "true"
    env = {e["name"]: e.get("value") for e in out.container()["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4317"
    assert env["OTEL_SERVICE_NAME"] == "gateway-api-inference-extension/epp"
    assert (env["OTEL_TRACES_SAMPLER"], env["OTEL_TRACES_SAMPLER_ARG"]) == ("parentbased_traceidratio", "0.1")
    assert "k8s.pod.name=$(POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]
    from picker import app

    parser = argparse.ArgumentParser()
    app.configure(parser)
    assert app.settings_from_args(parser.parse_args(out.container()["args"])).server.tracing is True


def test_pod_disruption_budget(rendered: dict[str, Rendered]) -> None:
    out = rendered["pdb"]
    pdb = out.one("PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 0
    assert "maxUnavailable" not in pdb["spec"]
    pod_labels = out.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    spec = rendered["pdb-max-unavailable"].one("PodDisruptionBudget")["spec"]
    assert spec["maxUnavailable"] == 1
    assert "minAvailable" not in spec


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "no-match-labels": ({}, "/inferencePool/modelServers/matchLabels"),
    "zero-replicas": (merged(BASE, ie(replicas=0)), "/inferenceExtension/replicas"),
    "unknown-engine": (merged(BASE, {"inferencePool": {"modelServerType": "tgi"}}), "'vllm', 'sglang'"),
    "port-out-of-range": (
        merged(BASE, {"inferencePool": {"targetPorts": [{"number": 70000}]}}),
        "targetPorts/0/number",
    ),
    "duplicate-port": (
        merged(BASE, {"inferencePool": {"targetPorts": [{"number": 8000}, {"number": 8000}]}}),
        "/inferencePool/targetPorts",
    ),
    "nine-ports": (
        merged(BASE, {"inferencePool": {"targetPorts": [{"number": 8000 + i} for i in range(9)]}}),
        "/inferencePool/targetPorts",
    ),
    "no-ports": (merged(BASE, {"inferencePool": {"targetPorts": []}}), "/inferencePool/targetPorts"),
    "failure-mode-typo": (merged(BASE, ie(failureMode="FailOpn")), "'FailOpen', 'FailClose'"),
    "ext-proc-port-zero": (merged(BASE, ie(extProcPort=0)), "/inferenceExtension/extProcPort"),
    "too-many-labels": (
        {"inferencePool": {"modelServers": {"matchLabels": {f"k{i}": "v" for i in range(65)}}}},
        "/inferencePool/modelServers/matchLabels",
    ),
    "bad-label-value": (
        {"inferencePool": {"modelServers": {"matchLabels": {"app": "has space"}}}},
        "/inferencePool/modelServers/matchLabels/app",
    ),
    "unknown-key": (merged(BASE, ie(replica=2)), "'replica' not allowed"),
    "app-protocol": (merged(BASE, {"inferencePool": {"appProtocol": "grpc"}}), "/inferencePool/appProtocol"),
    "chart-owned-flag": (
        merged(BASE, ie(flags={"grpc-port": 1})),
        "inferenceExtension.flags.grpc-port is set by the chart",
    ),
    "missing-config-file": (merged(BASE, ie(pluginsConfigFile="other.yaml")), '"other.yaml" is neither'),
    "pdb-both-bounds": (
        merged(BASE, ie(replicas=2, podDisruptionBudget={"enabled": True, "minAvailable": 1, "maxUnavailable": 1})),
        "not both",
    ),
    "pdb-blocks-drains": (merged(BASE, ie(podDisruptionBudget={"enabled": True})), "would block every node drain"),
    "pdb-with-leader-election": (
        merged(BASE, ie(replicas=3, podDisruptionBudget={"enabled": True, "minAvailable": 2})),
        "would block every drain of the leader's node",
    ),
    "pdb-max-unavailable-with-leader-election": (
        merged(BASE, ie(replicas=2, podDisruptionBudget={"enabled": True, "maxUnavailable": 1})),
        "only the leader is Ready",
    ),
    "rolling-update-never-finishes": (
        merged(BASE, ie(replicas=2, strategy={"type": "RollingUpdate"})),
        "with 2 replicas (leader election) only the leader is Ready, so a RollingUpdate with maxUnavailable 25%",
    ),
    "active-active-without-shared-cert": (
        merged(BASE, ie(replicas=2, activeActive=True, strategy={"type": "RollingUpdate"})),
        "inferenceExtension.activeActive needs inferenceExtension.certSecretName",
    ),
    "workers-with-leader-election": (merged(BASE, ie(replicas=2, workers=2)), "inferenceExtension.workers 2 needs"),
    "workers-active-active": (
        merged(BASE, ACTIVE_ACTIVE, ie(workers=2)),
        "inferenceExtension.workers 2 needs one pod without activeActive",
    ),
    "negative-workers": (merged(BASE, ie(workers=-1)), "/inferenceExtension/workers"),
    "active-active-recreate": (
        merged(BASE, ie(replicas=2, activeActive=True, certSecretName="picker-tls")),
        "strategy Recreate stops every replica at once",
    ),
    "active-active-owned-flag": (
        merged(BASE, ACTIVE_ACTIVE, ie(flags={"peer-port": 1})),
        "inferenceExtension.flags.peer-port is set by the chart",
    ),
    "rolling-update-max-unavailable-1": (
        merged(BASE, ie(replicas=3, strategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})),
        "never finishes",
    ),
    "pool-api-version": (
        merged(BASE, {"inferencePool": {"apiVersion": "inference.networking.k8s.io/v1alpha2"}}),
        "/inferencePool/apiVersion",
    ),
    "v1alpha2-two-ports": (
        merged(BASE, V1ALPHA2, {"inferencePool": {"targetPorts": [{"number": 8000}, {"number": 8001}]}}),
        "an inference.networking.x-k8s.io/v1alpha2 pool has one port",
    ),
    "v1alpha2-app-protocol": (
        merged(BASE, V1ALPHA2, {"inferencePool": {"appProtocol": "http"}}),
        "v1alpha2 pool has no appProtocol",
    ),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_invalid_values_rejected_with_readable_error(case: str, tmp_path: Path) -> None:
    values, message = INVALID[case]
    proc = template(tmp_path, values, check=False)
    assert proc.returncode != 0, f"{case} rendered:\n{proc.stdout[:400]}"
    assert message in proc.stderr, proc.stderr


def test_notes_tell_how_to_check_the_rollout(tmp_path: Path) -> None:
    # helm renders NOTES.txt only on install; render a copy of it as an ordinary template instead.
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_copy.tpl").write_text('{{- define "notes-copy" -}}' + notes + "{{- end -}}")
    (chart / "templates" / "notes-copy.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data:\n  text: {{ include "notes-copy" . | quote }}\n'
    )
    for replicas, values in ((1, BASE), (2, merged(BASE, ie(replicas=2))), (3, merged(BASE, ACTIVE_ACTIVE))):
        proc = template(tmp_path, values, chart=chart)
        objects = [o for o in yaml.safe_load_all(proc.stdout) if o]
        text = next(o for o in objects if o["metadata"]["name"] == "notes")["data"]["text"]
        assert f"kubectl -n {NAMESPACE} rollout status deployment/{RELEASE}-epp" in text
        assert f"kubectl -n {NAMESPACE} get inferencepool {RELEASE}" in text
        assert "get pods -l app=vllm-llama3-8b" in text
        active = "activeActive" in values.get("inferenceExtension", {})
        assert ("get lease" in text) == (replicas > 1 and not active)
        assert ("run active-active" in text) == active


def _leaf_keys(tree: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and key not in ("resources", "strategy", "matchLabels"):
            if key.endswith("ecurityContext"):
                keys.append(path)
            else:
                keys += _leaf_keys(value, path + ".")
        else:
            keys.append(path)
    return keys


def test_every_value_is_documented() -> None:
    doc = (CHART.parents[2] / "docs" / "install-helm.md").read_text()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = []
    for key in _leaf_keys(values):
        parent, _, leaf = key.rpartition(".")
        # A table row names the key in full, or the parent in full with the leaf as a `.leaf` sibling.
        if f"`{key}`" not in doc and not (f"`{parent}." in doc and f"`.{leaf}`" in doc):
            missing.append(key)
    assert not missing, f"values not in docs/install-helm.md: {missing}"


@pytest.mark.parametrize(
    "case",
    [
        "defaults",
        "leader-election",
        "plaintext",
        "tls-secret",
        "flags",
        "pool-off-v1alpha2-leader",
        "active-active",
        "workers",
    ],
)
def test_rendered_args_parse_with_picker_serve(case: str, rendered: dict[str, Rendered], tmp_path: Path) -> None:
    """The container args through the real `picker serve` argument parser."""
    import argparse

    from picker import app
    from picker.discovery import kubesettings

    parser = argparse.ArgumentParser(prog="picker serve", exit_on_error=False)
    app.configure(parser)
    if case == "flags":
        flags = {"refresh-metrics-interval": "100ms", "disable-endpoint-subset-filter": True, "v": 2}
        out = render(tmp_path, merged(BASE, ie(flags=flags)))
    else:
        out = rendered[case]
    args = parser.parse_args(out.container()["args"])  # every rendered flag is one picker serve knows
    # The pod's environment (the Deployment's env): the Lease holder is the pod name.
    kube = kubesettings.settings_from_args(args, {"NAMESPACE": NAMESPACE, "POD_NAME": f"{RELEASE}-epp-abc12"})
    assert kube is not None
    assert (kube.pool_name, kube.pool_namespace) == (out.args()["pool-name"], NAMESPACE)
    assert kube.pool_group == pool_group(case)
    assert kube.leader_election is (out.one("Deployment")["spec"]["replicas"] > 1 and case != "active-active")
    peers = app.settings_from_args(args).peers
    assert (peers.service, peers.port) == ((f"{RELEASE}-epp", 9005) if case == "active-active" else ("", 9005))
    assert kube.identity == f"{RELEASE}-epp-abc12"
    assert (args.grpc_port, args.grpc_health_port, args.metrics_port) == (9002, 9003, 9090)
    assert args.config_file == "/config/default-plugins.yaml"
    assert args.zap_encoder == "json"
    assert args.secure_serving is (case != "plaintext")
    assert args.cert_path == ("/etc/picker/tls" if case in ("tls-secret", "active-active") else None)
    assert args.workers == (4 if case == "workers" else 0)  # 0: what the pod's CPU limit allows
    if case == "flags":
        assert args.refresh_metrics_interval == pytest.approx(0.1)
        assert args.disable_endpoint_subset_filter is True
        assert args.v == 2


@pytest.mark.parametrize("engine", ENGINES)
def test_rendered_plugins_config_loads_in_picker(engine: str, rendered: dict[str, Rendered]) -> None:
    """The ConfigMap's config through picker's own loader, and the engine name known to its scraper."""
    from picker.endpoints.inflight import InflightTracker
    from picker.scheduling.config import load_config
    from picker.scheduling.framework import PluginContext
    from picker.scrape import engines

    text = rendered[f"engine-{engine}"].one("ConfigMap")["data"]["default-plugins.yaml"]
    config = load_config(text, PluginContext(clock=lambda: 0.0, inflight=InflightTracker()))
    assert set(config.profiles) == {"default"}
    (extractor,) = config.configured("extractor")
    default_engine = getattr(extractor.params, "default_engine", None)
    assert default_engine == engine
    assert engines.is_known(engine)
    assert engines.mapping_for(engine).name == {"triton-tensorrt-llm": "triton"}.get(engine, engine)
