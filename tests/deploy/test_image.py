"""The container image, built for real: scripts/build-image.sh (buildah, Debian's package; the base made with
mmdebstrap from Debian's packages, since Docker Hub's python image is out of reach), then picker run from it.

Marked ``image``: CI runs these as their own step after the main suite (.ci/run); the first build on a machine
takes a few minutes (base tarball, every wheel), later ones reuse buildah's layer cache.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import orjson
import pytest

from picker.extproc import tls
from tests.deploy._tools import REPO
from tests.e2e.backends import Backend
from tests.e2e.procs import free_port, wait_http
from tests.extproc.gateway import EnvoyFullDuplex, gateway

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(900)]  # the first build takes minutes

IMAGE = "localhost/picker:dev"
CACHE = os.environ.get("PICKER_IMAGE_CACHE", os.path.join(os.environ.get("HOME", "/root"), ".cache", "picker-image"))
MAX_IMAGE_MB = 450  # measured 387 MB: Debian minbase + python3.11 (225 MB) + the venv; slim python would be less


DRIVER = os.environ.get("PICKER_IMAGE_STORAGE_DRIVER", "overlay")  # as scripts/build-image.sh


def buildah(*args: str) -> list[str]:
    storage = ["--storage-driver", DRIVER, "--root", f"{CACHE}/storage-{DRIVER}", "--runroot", f"{CACHE}/run"]
    return ["buildah", *storage, *args]


@pytest.fixture(scope="module")
def image() -> str:
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-image.sh")], capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, f"scripts/build-image.sh failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout.strip().splitlines()[-1]  # "localhost/picker:dev 387 MB"


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    name = subprocess.run(buildah("from", "--quiet", IMAGE), capture_output=True, text=True, check=True).stdout
    try:
        yield name.strip()
    finally:
        subprocess.run(buildah("rm", name.strip()), capture_output=True, check=False)


def run_in(container: str, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = buildah("run", "--isolation", "chroot", "--network", "host", container, "--", *argv)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_image_size_and_config(image: str) -> None:
    match = re.fullmatch(rf"{re.escape(IMAGE)}\s+([\d.]+) (MB|GB)", image)
    assert match, image
    size_mb = float(match.group(1)) * (1000 if match.group(2) == "GB" else 1)
    print(f"\nimage {IMAGE}: {size_mb:g} MB")
    assert size_mb < MAX_IMAGE_MB
    out = subprocess.run(
        buildah("inspect", "--type", "image", IMAGE), capture_output=True, text=True, check=True
    ).stdout
    config = orjson.loads(out)["OCIv1"]["config"]
    assert config["Entrypoint"] == ["picker", "serve"]
    assert config["User"] == "65532:65532"
    assert set(config["ExposedPorts"]) == {"9002/tcp", "9003/tcp", "9090/tcp"}


def test_picker_runs_from_the_image(container: str) -> None:
    help_out = run_in(container, "picker", "serve", "--help")
    assert help_out.returncode == 0, help_out.stderr
    assert "--tracing" in help_out.stdout
    assert "--pool-name" in help_out.stdout
    who = run_in(container, "id", "-u")
    assert who.stdout.strip() == "65532"
    # No compiler and no pip cache came along; the bytecode is precompiled (read-only root filesystem).
    assert run_in(container, "sh", "-c", "command -v gcc cc || true").stdout.strip() == ""
    found = run_in(container, "python", "-c", "import picker.app, opentelemetry.sdk, kubernetes_asyncio; print('ok')")
    assert found.stdout.strip() == "ok", found.stderr
    # The C extension was compiled in the builder stage and is what the image runs.
    native = run_in(
        container, "python", "-c", "from picker.scheduling import native; from picker.kvcache import index, keys; "
        "print(native.NATIVE, index.NATIVE, keys.NATIVE)"
    )  # fmt: skip
    assert native.stdout.strip() == "True True True", native.stderr


@contextlib.asynccontextmanager
async def serving_in(container: str, certs: Path, *args: str) -> AsyncIterator[asyncio.subprocess.Process]:
    run = buildah("run", "--isolation", "chroot", "--network", "host", "--volume", f"{certs}:/etc/picker/tls:ro")
    proc = await asyncio.create_subprocess_exec(
        *run, container, "--", "picker", "serve", "--cert-path", "/etc/picker/tls", *args,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 20)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, bytes]:
    """A self-signed pair in a directory the image's uid 65532 can read; the certificate to trust it."""
    pair = tls.self_signed()
    directory = tmp_path / "tls"
    directory.mkdir()
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)
    for path in (tmp_path, directory):
        path.chmod(0o755)
    for path in (directory / "tls.crt", directory / "tls.key"):
        path.chmod(0o644)
    return directory, pair.cert_pem


QUEUE_ONLY = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""


async def test_picker_in_the_image_routes(container: str, certs: tuple[Path, bytes]) -> None:
    """``picker serve`` inside the image (host network, TLS with a mounted certificate) routes to the backend
    with the shortest queue, over a real gRPC TLS connection from the host."""
    cert_dir, cert_pem = certs
    backends = [Backend("b0", queue=9), Backend("b1", queue=0)]
    for b in backends:
        await b.start()
    grpc_port, health_port, metrics_port = free_port(), free_port(), free_port()
    credentials = grpc.ssl_channel_credentials(root_certificates=cert_pem)
    body = orjson.dumps({"model": "m", "prompt": "hello", "max_tokens": 2})
    try:
        async with serving_in(
            container, cert_dir,
            "--endpoints", ",".join(b.hostport for b in backends), "--host", "127.0.0.1",
            "--grpc-port", str(grpc_port), "--grpc-health-port", str(health_port), "--metrics-port", str(metrics_port),
            "--refresh-metrics-interval", "50ms", "--config-text", QUEUE_ONLY,
            "--grpc-frontend", "native",  # the image's own build of the native front, not a fallback
        ) as proc:  # fmt: skip
            await wait_http(f"http://127.0.0.1:{metrics_port}/metrics", 60.0, proc)
            await asyncio.sleep(0.3)  # a few scrapes: picker has seen both queues
            async with gateway(EnvoyFullDuplex, f"127.0.0.1:{grpc_port}", credentials) as gw:
                outs = [await gw.request({":path": "/v1/completions"}, [body]) for _ in range(3)]
        assert [o.destination for o in outs] == [backends[1].hostport] * 3
    finally:
        for b in backends:
            await b.stop()
