"""The chart installed for real: real helm into the real API server, rolled out on the kwok node, upgraded, removed.

Every object the chart renders is admitted by kube-apiserver against the real schemas (the built-in kinds and the
upstream InferencePool CRDs), and again with strict field validation (an unknown field fails). Without a kubelet the
picker container never runs here: kwok marks the Deployment's pods Running and Ready, so `kubectl rollout status`
exercises the Deployment, its strategy and the scheduler, not the image or the probes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from picker.bench.cluster import ControlPlane
from picker.discovery.rbac import rules_for
from tests.cluster.stack import EPP, RELEASE, helm
from tests.deploy._tools import CHART
from tests.deploy.test_chart import ACTIVE_ACTIVE, BASE, V1ALPHA2, ie, merged

pytestmark = pytest.mark.timeout(240)

CASES: dict[str, dict[str, Any]] = {
    "pool-v1": BASE,
    "pool-v1alpha2": merged(BASE, V1ALPHA2),
    "leader-election": merged(BASE, ie(replicas=2)),
    "active-active": merged(BASE, ACTIVE_ACTIVE),
}
# Namespaced kinds the chart may render; after `helm uninstall` none of them may be left with the release's label.
KINDS = "deployments,replicasets,pods,services,configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets"


def rollout(cp: ControlPlane, ns: str) -> None:
    cp.kubectl("rollout", "status", f"deployment/{EPP}", "-n", ns, "--timeout=90s", timeout_s=100)


def pool_kind(values: dict[str, Any]) -> str:
    version = values.get("inferencePool", {}).get("apiVersion", "inference.networking.k8s.io/v1")
    return f"inferencepools.{version.split('/')[0]}"


def left_over(cp: ControlPlane, ns: str, values: dict[str, Any]) -> list[str]:
    out = cp.get(f"{KINDS},{pool_kind(values)}", "-n", ns, "-l", f"app.kubernetes.io/instance={RELEASE}")
    return [f"{o['kind']}/{o['metadata']['name']}" for o in out["items"]]


def role_rules(cp: ControlPlane, ns: str) -> set[tuple[str, str, frozenset[str]]]:
    role = cp.get("role", EPP, "-n", ns)
    return {
        (group, resource, frozenset(rule["verbs"]))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


@pytest.mark.parametrize("case", list(CASES))
def test_install_rollout_upgrade_uninstall(control_plane: ControlPlane, case: str, tmp_path: Path) -> None:
    cp, values = control_plane, CASES[case]
    ns = f"chart-{case}"
    cp.create_namespace(ns)
    try:
        if values.get("inferenceExtension", {}).get("certSecretName"):
            pki = cp.root / "pki"
            cp.kubectl("create", "secret", "tls", "picker-tls", "-n", ns,
                       f"--cert={pki / 'apiserver.crt'}", f"--key={pki / 'apiserver.key'}")  # fmt: skip
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        helm(cp, "install", RELEASE, str(CHART), "-n", ns, "-f", str(values_file))

        # Admitted for real; and again with strict field validation, so an unknown field is an error, not a warning.
        manifest = helm(cp, "get", "manifest", RELEASE, "-n", ns).stdout
        objects = [o for o in yaml.safe_load_all(manifest) if o]
        cp.kubectl("apply", "-n", ns, "--dry-run=server", "--validate=strict", "-f", "-", stdin=manifest)
        for obj in objects:
            group = obj["apiVersion"].rpartition("/")[0]
            cp.kubectl("get", f"{obj['kind']}.{group}/{obj['metadata']['name']}".replace("./", "/"), "-n", ns)
        kinds = {o["kind"] for o in objects}
        assert {"Deployment", "Service", "Role", "RoleBinding", "ServiceAccount", "ConfigMap", "InferencePool"} <= kinds

        rollout(cp, ns)
        deployment = cp.get("deployment", EPP, "-n", ns)
        replicas = deployment["spec"]["replicas"]
        assert deployment["status"]["readyReplicas"] == replicas
        pods = cp.get("pods", "-n", ns, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
        running = [
            p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]
        assert len(running) == replicas
        assert all(p["spec"]["nodeName"] == "kwok-node" for p in running)
        assert all(p["status"]["podIP"].startswith("127.") for p in running)  # kwok's loopback CIDR

        # The Role the API server enforces is exactly what picker declares it calls.
        leader = case == "leader-election"
        peers = case == "active-active"
        group = pool_kind(values).split(".", 1)[1]
        assert role_rules(cp, ns) == {r.key() for r in rules_for(leader_election=leader, pool_group=group, peers=peers)}

        # ... and the API server's RBAC lets the chart's ServiceAccount do exactly those calls, and not write.
        account = f"system:serviceaccount:{ns}:{EPP}"
        for rule in rules_for(leader_election=leader, pool_group=group, peers=peers):
            resource = f"{rule.resource}.{rule.api_group}" if rule.api_group else rule.resource
            for verb in rule.verbs:
                assert can_i(cp, ns, account, verb, resource), (verb, resource)
        assert not can_i(cp, ns, account, "update", "pods")
        assert not can_i(cp, ns, account, "list", "secrets")

        # An upgrade with a changed value rolls the pods again.
        before = {p["metadata"]["name"] for p in running}
        helm(
            cp,
            "upgrade",
            RELEASE,
            str(CHART),
            "-n",
            ns,
            "-f",
            str(values_file),
            "--set",
            "inferenceExtension.flags.v=2",
        )
        rollout(cp, ns)
        deployment = cp.get("deployment", EPP, "-n", ns)
        assert deployment["metadata"]["annotations"]["deployment.kubernetes.io/revision"] == "2"
        assert "--v=2" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        new = _wait_pods(cp, ns, replicas, exclude=before)
        assert all("--v=2" in p["spec"]["containers"][0]["args"] for p in new)

        helm(cp, "uninstall", RELEASE, "-n", ns, "--wait", "--timeout=90s")
        deadline = time.monotonic() + 60
        while (left := left_over(cp, ns, values)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert left == []
        assert helm(cp, "status", RELEASE, "-n", ns, check=False).returncode != 0
    finally:
        helm(cp, "uninstall", RELEASE, "-n", ns, check=False)
        cp.delete_namespace(ns)


def can_i(cp: ControlPlane, ns: str, user: str, verb: str, resource: str) -> bool:
    proc = cp.kubectl("auth", "can-i", verb, resource, "-n", ns, f"--as={user}", check=False)
    return proc.stdout.strip() == "yes"


def _wait_pods(cp: ControlPlane, ns: str, count: int, *, exclude: set[str]) -> list[dict[str, Any]]:
    """The release's pods once exactly ``count`` are Running and none of ``exclude`` is left."""
    deadline = time.monotonic() + 60
    while True:
        pods = cp.get("pods", "-n", ns, "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
        names = {p["metadata"]["name"] for p in pods}
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        if len(running) == count == len(pods) and not names & exclude:
            return running
        if time.monotonic() > deadline:
            phases = [(p["metadata"]["name"], p["status"].get("phase")) for p in pods]
            pytest.fail(f"pods after the upgrade: {json.dumps(phases)}")
        time.sleep(0.2)


def test_the_api_server_enforces_the_crd_schema(control_plane: ControlPlane) -> None:
    """A pool the upstream schema refuses is refused: the CRDs installed are the real ones, validating."""
    cp = control_plane
    bad = {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {
            "targetPorts": [{"number": 8000}],
            "selector": {"matchLabels": {"app": "x"}},
            "endpointPickerRef": {"name": "epp", "port": {"number": 9002}, "failureMode": "Sometimes"},
        },
    }
    proc = cp.kubectl("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert proc.returncode != 0
    assert "failureMode" in proc.stderr
    assert "Unsupported value" in proc.stderr
