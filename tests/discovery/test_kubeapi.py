"""Connection config: in-cluster service account (token re-read off the loop), kubeconfig, explicit URL."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from picker.discovery import kubeapi
from picker.discovery.kubeapi import KubeApi, KubeApiError, Resource, connect
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import pod

pytestmark = pytest.mark.timeout(20)

PODS = Resource("", "v1", "pods", "default")


@pytest.fixture
def service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "token").write_text("token-1\n")
    (tmp_path / "ca.crt").write_text("not read here\n")
    monkeypatch.setattr(kubeapi, "_SA_DIR", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return tmp_path


async def test_in_cluster_configuration(service_account: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = await kubeapi._in_cluster_configuration()
    assert cfg.host == "https://10.96.0.1:443"
    assert cfg.ssl_ca_cert == str(service_account / "ca.crt")
    assert await cfg.get_api_key_with_prefix("BearerToken") == "Bearer token-1"
    # A rotated token is picked up once the refresh period has passed.
    (service_account / "token").write_text("token-2")
    assert await cfg.get_api_key_with_prefix("BearerToken") == "Bearer token-1"  # not yet due
    monkeypatch.setattr(kubeapi, "_TOKEN_REFRESH_S", 0.0)
    assert await cfg.get_api_key_with_prefix("BearerToken") == "Bearer token-2"


async def test_in_cluster_ipv6_host(service_account: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    cfg = await kubeapi._in_cluster_configuration()
    assert cfg.host == "https://[fd00::1]:443"


async def test_not_in_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeApiError, match="not in a cluster"):
        async with connect(in_cluster=True):
            pass


async def test_kubeconfig_with_a_token(tmp_path: Path) -> None:
    async with FakeApiServer() as api:
        api.create("pods", pod("a"))
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": api.url}}],
            "users": [{"name": "u", "user": {"token": "secret-token"}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        }
        path = tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        async with connect(kubeconfig=str(path)) as client:
            listed = await KubeApi(client).list(PODS)
        assert [i["metadata"]["name"] for i in listed.items] == ["a"]
        assert api.authorizations == ["Bearer secret-token"]


async def test_missing_kubeconfig(tmp_path: Path) -> None:
    with pytest.raises(KubeApiError, match="cannot load kubeconfig"):
        async with connect(kubeconfig=str(tmp_path / "nope"), in_cluster=False):
            pass


async def test_explicit_url_sends_no_credentials() -> None:
    async with FakeApiServer() as api, connect(api_server=api.url) as client:
        await KubeApi(client).list(PODS)
        assert api.authorizations == [None]


LEASES = Resource("coordination.k8s.io", "v1", "leases", "default")


async def test_object_get_create_replace_with_optimistic_concurrency() -> None:
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {}}
    async with FakeApiServer() as api, connect(api_server=api.url) as client:
        kube = KubeApi(client)
        with pytest.raises(kubeapi.ResourceNotFound):
            await kube.get(LEASES, "l")
        created = await kube.create(LEASES, lease)
        assert created["metadata"]["namespace"] == "default"
        with pytest.raises(kubeapi.ResourceConflict, match="AlreadyExists"):
            await kube.create(LEASES, lease)
        read = await kube.get(LEASES, "l")
        assert read == created
        mine = {**read, "spec": {"holderIdentity": "a"}}
        updated = await kube.replace(LEASES, mine)
        assert int(updated["metadata"]["resourceVersion"]) > int(read["metadata"]["resourceVersion"])
        # A write based on the version read before that update is refused: re-read and decide again.
        with pytest.raises(kubeapi.ResourceConflict, match="the object has been modified"):
            await kube.replace(LEASES, {**read, "spec": {"holderIdentity": "b"}})
        assert (await kube.get(LEASES, "l"))["spec"] == {"holderIdentity": "a"}
        # Without a resourceVersion the update is unconditional, as on a real apiserver.
        unconditional = {**read, "metadata": {"name": "l"}, "spec": {"holderIdentity": "c"}}
        assert (await kube.replace(LEASES, unconditional))["spec"] == {"holderIdentity": "c"}
        api.fail_next("update", "leases", 503)
        with pytest.raises(KubeApiError) as failed:
            await kube.replace(LEASES, unconditional)
        assert failed.value.status == 503
    assert [s for _, _, s in api.responses] == [404, 201, 409, 200, 200, 409, 200, 200, 503]
