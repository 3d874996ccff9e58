"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler and kwok.

Used by ``picker demo --kube`` and by the ``kube`` tests (tests/cluster). The binaries are those
scripts/install-kube.sh builds into .tools/bin (Kubernetes 1.34.4, etcd 3.6.4, kwok 0.7.0; helm comes from
scripts/install-tools.sh). Every server listens on 127.0.0.1 on a free port; kwok gives the pods it runs addresses in
``127.1.0.0/16`` and the node 127.0.0.1, so nothing discovered is ever outside loopback. There is no kubelet: pods
bound to the kwok node are marked Running by kwok; a faked model-server pod gets the loopback address of a real
server (``ControlPlane.fake_pod``). The upstream CRDs come from ``shared/third_party`` beside the checkout.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from picker.procutil import die_with_parent, free_ports

__all__ = [
    "BINARIES",
    "ClusterError",
    "ControlPlane",
    "ToolsMissing",
    "crd_files",
    "kubeconfig_text",
    "missing_tools",
    "require_tools",
    "running_control_plane",
    "third_party_dir",
    "tool",
]

REPO = Path(__file__).resolve().parents[2]
TOOLS_BIN = REPO / ".tools" / "bin"
KUBE_VERSION = "v1.34.4"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok")
HELM = "helm"  # installed by scripts/install-tools.sh
NODE = "kwok-node"
POD_CIDR = "127.1.0.0/16"  # kwok's pod addresses: loopback, never a routable range
SERVICE_CIDR = "10.0.0.0/24"  # ClusterIPs are only ever written to objects; nothing here connects to one
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
_READY_TIMEOUT_S = 60.0


class ClusterError(RuntimeError):
    """The control plane, or a command run against it, failed; the message carries the command's output."""


class ToolsMissing(ClusterError):
    """A control-plane binary (or helm) is not built; the message names the script that builds it."""


def missing_tools(names: Sequence[str] = (*BINARIES, HELM)) -> list[str]:
    """Which of ``names`` are not in .tools/bin."""
    return [name for name in names if not (TOOLS_BIN / name).exists()]


def require_tools(names: Sequence[str] = (*BINARIES, HELM)) -> None:
    """Raise ``ToolsMissing`` naming the missing tools and the command(s) that build them."""
    missing = missing_tools(names)
    if not missing:
        return
    if HELM in missing:
        how = "`bash scripts/install-tools.sh` (it installs helm and runs scripts/install-kube.sh"
    else:
        how = "`bash scripts/install-kube.sh` (scripts/install-tools.sh runs it too"
    raise ToolsMissing(
        f"the local control plane tools are not built ({', '.join(missing)} missing in {TOOLS_BIN}): run {how}; "
        "a cold build of the control plane takes about 20 minutes on 2 cores, cached by version afterwards)"
    )


def third_party_dir() -> Path:
    """``shared/third_party`` beside the checkout (or beside one of its parent folders, for a worktree)."""
    for parent in REPO.parents:
        candidate = parent / "shared" / "third_party"
        if candidate.is_dir():
            return candidate
    raise ClusterError(
        f"shared/third_party (the upstream InferencePool CRDs, gie-crds/ and llm-d-crds/) not found beside {REPO} "
        "or a parent folder"
    )


def crd_files() -> dict[str, Path]:
    """The upstream CRD files by resource name (``inferencepools.inference.networking.k8s.io``, ...)."""
    root = third_party_dir()
    files = sorted((root / "gie-crds").glob("*.yaml")) + sorted((root / "llm-d-crds").glob("*.yaml"))
    out = {}
    for path in files:
        group, plural = path.stem.split("_", 1)
        out[f"{plural}.{group}"] = path
    return out


def tool(name: str) -> Path:
    """The path of a built tool; ``ToolsMissing`` when it is not there."""
    require_tools((name,))
    return TOOLS_BIN / name


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_pki(d: Path) -> None:
    """A CA, the API server's serving pair, an admin client pair (system:masters) and the service-account keys."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=picker-test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    sans = "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default," \
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"  # fmt: skip
    (d / "serving.ext").write_text(f"{sans}\nextendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject, ext in (
        ("apiserver", "/CN=kube-apiserver", "serving.ext"),
        ("admin", "/O=system:masters/CN=admin", "client.ext"),
    ):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", ext, "-out", f"{name}.crt", cwd=d)  # fmt: skip
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig_text(server: str, ca: Path, *, cert: Path | None = None, key: Path | None = None,
                    token: str | None = None, namespace: str = "default") -> str:  # fmt: skip
    """A kubeconfig for one user: a client certificate, or only a bearer token (a ServiceAccount)."""
    user: dict[str, str] = {}
    if cert is not None and key is not None:
        user = {"client-certificate": str(cert), "client-key": str(key)}
    if token is not None:
        user = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": "user", "namespace": namespace}}],
        "current-context": "local",
    }
    return yaml.safe_dump(config)


@dataclass
class _Proc:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    def start(self) -> None:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        # setpriv sets the parent-death signal and execs (a preexec_fn would make subprocess fork, not vfork).
        setpriv = shutil.which("setpriv")
        argv = [setpriv, "--pdeathsig", "TERM", "--", *self.argv] if setpriv else self.argv
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=None if setpriv else die_with_parent,
        )

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, n_bytes: int = 3000) -> str:
        try:
            return self.log_path.read_bytes()[-n_bytes:].decode(errors="replace")
        except OSError:
            return ""


@dataclass
class ControlPlane:
    """The running control plane; ``kubectl`` runs as the admin (system:masters)."""

    root: Path
    etcd_port: int
    apiserver_port: int
    procs: dict[str, _Proc] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def ca(self) -> Path:
        return self.root / "pki" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    # --- kubectl -------------------------------------------------------------------------------------------

    def kubectl(
        self,
        *args: str,
        stdin: str | None = None,
        check: bool = True,
        timeout_s: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        proc = subprocess.run(
            [str(tool("kubectl")), *args], input=stdin, capture_output=True, text=True, env=env, timeout=timeout_s
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        return proc

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Real helm against this control plane, as the admin."""
        proc = subprocess.run(
            [str(tool(HELM)), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
        return proc

    def apply(self, objects: Sequence[Mapping[str, Any]] | Mapping[str, Any], *, namespace: str | None = None) -> None:
        items = [objects] if isinstance(objects, Mapping) else list(objects)
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", stdin=yaml.safe_dump_all(items))

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def create_namespace(self, name: str) -> None:
        """A namespace, ready for pods: its ``default`` ServiceAccount exists (the controller-manager makes it)."""
        self.kubectl("create", "namespace", name)
        deadline = time.monotonic() + 30
        while self.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise ClusterError(f"namespace {name}: no default ServiceAccount after 30 s")
            time.sleep(0.1)

    def delete_namespace(self, name: str) -> None:
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")

    def token_kubeconfig(self, service_account: str, namespace: str, path: Path, server: str | None = None) -> Path:
        """A kubeconfig holding only a token of ``service_account`` (so the API server enforces its RBAC), for
        ``server`` (default: the API server itself)."""
        token = self.kubectl("create", "token", service_account, "-n", namespace, "--duration=1h").stdout.strip()
        path.write_text(kubeconfig_text(server or self.server, self.ca, token=token, namespace=namespace))
        return path

    def fake_pod(
        self, namespace: str, name: str, labels: Mapping[str, str], ip: str, *, ready: bool = True
    ) -> dict[str, Any]:
        """A model-server pod that no kubelet runs, bound to the kwok node (EndpointSlices skip a pod without an
        existing node), its status then written through the API: Running, ``podIP`` = ``ip`` (a loopback address
        where a test server listens), Ready as asked. kwok keeps a podIP that is already set."""
        if not ip.startswith("127."):
            raise ValueError(f"a faked pod's IP must be loopback, not {ip}")
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {
                "nodeName": NODE,
                "containers": [{"name": "server", "image": "model-server:test"}],
                "tolerations": [{"operator": "Exists"}],
            },
        }
        self.apply(pod)
        self.set_pod_status(namespace, name, ip, ready=ready)
        return pod

    def set_pod_status(self, namespace: str, name: str, ip: str, *, ready: bool = True) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {
            "status": {
                "phase": "Running",
                "podIP": ip,
                "podIPs": [{"ip": ip}],
                "hostIP": "127.0.0.1",
                "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now},
                    {"type": "ContainersReady", "status": "True" if ready else "False", "lastTransitionTime": now},
                ],
            }
        }
        self.kubectl(
            "patch", "pod", name, "-n", namespace, "--subresource=status", "--type=merge", "-p", json.dumps(status)
        )

    # --- lifecycle -----------------------------------------------------------------------------------------

    def _etcd_argv(self) -> list[str]:
        peer = free_ports(1)[0]
        url = self.etcd_url
        return [
            str(tool("etcd")), "--name=test", f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=test=http://127.0.0.1:{peer}", "--unsafe-no-fsync", "--log-level=warn",
        ]  # fmt: skip

    def _apiserver_argv(self) -> list[str]:
        pki = self.root / "pki"
        return [
            str(tool("kube-apiserver")), f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.apiserver_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", "--authorization-mode=RBAC",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--endpoint-reconciler-type=none",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}", f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--enable-priority-and-fairness=false", "-v=0",
        ]  # fmt: skip

    def _component_argv(self, name: str) -> list[str]:
        kc = str(self.kubeconfig)
        common = [
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false", "-v=0",
        ]  # fmt: skip
        if name == "kube-controller-manager":
            pki = self.root / "pki"
            common += [f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}"]
            # The kwok node misses heartbeats while a fault test restarts kube-apiserver; the node-lifecycle
            # controller would then mark every pod on it NotReady, a fault of the fake node, not of picker. (It also
            # lifts a new node's not-ready taint: start() does that instead.)
            common += ["--controllers=*,-node-lifecycle-controller"]
        return [str(tool(name)), *common]

    def _kwok_argv(self) -> list[str]:
        return [
            str(tool("kwok")), f"--kubeconfig={self.kubeconfig}", "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--cidr={POD_CIDR}", "--node-ip=127.0.0.1", "--server-address=",
        ]  # fmt: skip

    def _spawn(self, name: str, argv: list[str]) -> None:
        proc = _Proc(name, argv, self.root / "logs" / f"{name}.log")
        self.procs[name] = proc
        proc.start()

    def _wait(self, what: str, ok: Any, timeout_s: float = _READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not ok():
            for proc in self.procs.values():
                if proc.proc is not None and proc.proc.poll() is not None:
                    raise ClusterError(
                        f"{proc.name} exited {proc.proc.returncode} while waiting for {what}:\n{proc.tail()}"
                    )
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} not ready after {timeout_s:.0f} s")
            time.sleep(0.1)

    def _etcd_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        except OSError:
            return False

    def apiserver_ready(self) -> bool:
        proc = self.kubectl("get", "--raw=/readyz", check=False, timeout_s=10)
        return proc.returncode == 0 and proc.stdout.strip() == "ok"

    def start_etcd(self) -> None:
        self._spawn("etcd", self._etcd_argv())
        self._wait("etcd", self._etcd_ready)

    def start_apiserver(self) -> None:
        self._spawn("kube-apiserver", self._apiserver_argv())
        self._wait("kube-apiserver", self.apiserver_ready)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            proc.stop()

    def start(self) -> None:
        (self.root / "pki").mkdir(parents=True)
        (self.root / "logs").mkdir()
        _make_pki(self.root / "pki")
        pki = self.root / "pki"
        self.kubeconfig.write_text(kubeconfig_text(self.server, self.ca, cert=pki / "admin.crt", key=pki / "admin.key"))
        self.start_etcd()
        self.start_apiserver()
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._spawn(name, self._component_argv(name))
        self._spawn("kwok", self._kwok_argv())
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE,
                    "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"type": "kwok", "kubernetes.io/hostname": NODE, "kubernetes.io/os": "linux"},
                },
            }
        )
        self.install_crds()
        self.kubectl("wait", "--for=condition=Ready", f"node/{NODE}", "--timeout=60s", timeout_s=70)
        # The node-lifecycle controller is off (below): lift the not-ready taint a new Node is admitted with.
        self.kubectl("taint", "node", NODE, "node.kubernetes.io/not-ready:NoSchedule-", check=False)
        self._wait("default ServiceAccount", lambda: self.kubectl("get", "sa", "default", check=False).returncode == 0)

    def install_crds(self, names: Sequence[str] | None = None) -> None:
        files = crd_files()
        chosen = [files[n] for n in names] if names is not None else list(files.values())
        args = [a for path in chosen for a in ("-f", str(path))]
        self.kubectl("apply", "--server-side", *args)
        crds = [f"crd/{n}" for n in (names if names is not None else files)]
        self.kubectl("wait", "--for=condition=Established", *crds, "--timeout=30s", timeout_s=40)
        self.wait_crds_served()

    def uninstall_crd(self, name: str) -> None:
        self.kubectl("delete", f"crd/{name}", "--wait=true", "--timeout=30s", timeout_s=40)
        self.wait_crds_served()

    def wait_crds_served(self) -> None:
        """Until every installed CRD's objects can be listed: right after a CRD change the API server answers 429
        "storage is (re)initializing" for a moment, which a test would see as picker's transient warnings."""
        installed = [n for n in crd_files() if self.kubectl("get", f"crd/{n}", check=False).returncode == 0]
        self._wait(
            "CRD storage", lambda: all(self.kubectl("get", n, "-A", check=False).returncode == 0 for n in installed)
        )

    def shutdown(self) -> None:
        """SIGTERM to every process at once; whatever still runs 5 s later is killed."""
        for proc in self.procs.values():
            if proc.running() and proc.proc is not None:
                proc.proc.terminate()
        deadline = time.monotonic() + 5
        for proc in self.procs.values():
            if proc.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        for name in list(self.procs):
            self.procs.pop(name).stop(signal.SIGKILL)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.tail()}" for p in self.procs.values())


@contextlib.contextmanager
def running_control_plane() -> Iterator[ControlPlane]:
    """Start the whole control plane in a temporary folder; stop every process and remove the folder after
    (also when the block fails or is interrupted)."""
    require_tools(BINARIES)
    root = Path(tempfile.mkdtemp(prefix="picker-kube-"))
    etcd_port, apiserver_port = free_ports(2)
    cp = ControlPlane(root, etcd_port, apiserver_port)
    try:
        cp.start()
        yield cp
    finally:
        cp.shutdown()
        shutil.rmtree(root, ignore_errors=True)
