"""Kubernetes API access: connection config, raw list/watch calls, and get/create/replace of single objects.

kubernetes-asyncio supplies configuration (in-cluster service account, kubeconfig with exec/OIDC plugins), TLS
and auth headers and the aiohttp session. Its ``Watch`` helper is not used: it re-tries a 410 once with the same
stale resourceVersion, decodes every event into generated model classes, and hides whether a watch ended or
failed. Here a list returns plain dicts and its resourceVersion; a watch yields raw event dicts (decoded with
orjson) and raises ``ResourceGone`` on 410, whether the server says so with the HTTP status or with an ERROR
event. The list-then-watch loop built on these lives in ``informer.py``. Leader election (``leaderelection.py``)
reads and writes its Lease with ``get``/``create``/``replace``: a 409 (a stale resourceVersion on update, or an
object that already exists on create) is raised as ``ResourceConflict``; a 403 as ``ResourceForbidden``; an error
status whose body is not JSON (a real API server answers a group it does not serve with a plain-text 404) by the
status alone.

Every error leaving this module is a ``KubeApiError`` (transport errors chained ``from`` the aiohttp error).
No blocking call runs on the event loop: kubeconfig parsing and service-account file reads go to a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from kubernetes_asyncio import client as kclient
from kubernetes_asyncio import config as kconfig

__all__ = [
    "ApiClientFactory",
    "KubeApi",
    "KubeApiError",
    "ListResult",
    "Resource",
    "ResourceConflict",
    "ResourceForbidden",
    "ResourceGone",
    "ResourceNotFound",
    "connect",
]

log = logging.getLogger(__name__)

ApiClientFactory = Callable[[], Awaitable[kclient.ApiClient]]

_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_TOKEN_REFRESH_S = 60.0  # bound service-account tokens rotate; kubelet refreshes the file well before expiry
_WATCH_READ_SLACK_S = 30.0  # a watch silent this long past its timeoutSeconds is dead


class KubeApiError(Exception):
    """A failed API call. ``status`` is the HTTP status or Status.code; 0 for transport errors."""

    def __init__(self, status: int, reason: str, message: str = "") -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason


class ResourceGone(KubeApiError):
    """410: the resourceVersion is older than the server's history. Relist."""


class ResourceNotFound(KubeApiError):
    """404: on a collection, the resource type (CRD) is not installed; on an object, there is no such object."""


class ResourceForbidden(KubeApiError):
    """403: the identity picker runs as may not do this (its Role lacks the rule)."""


class ResourceConflict(KubeApiError):
    """409: an update carried a stale resourceVersion, or a create found the object already there. Re-read."""


def _status_error(status: int, body: Any) -> KubeApiError:
    reason, message = "", ""
    if isinstance(body, dict):
        reason, message = str(body.get("reason") or ""), str(body.get("message") or "")
        status = int(body.get("code") or status)
    if status == 410:
        return ResourceGone(status, reason or "Gone", message)
    if status == 404:
        return ResourceNotFound(status, reason or "NotFound", message)
    if status == 409:
        return ResourceConflict(status, reason or "Conflict", message)
    if status == 403:
        return ResourceForbidden(status, reason or "Forbidden", message)
    return KubeApiError(status, reason or "Error", message)


@dataclass(frozen=True, slots=True)
class Resource:
    """One namespaced collection, optionally narrowed by label and field selectors."""

    group: str  # "" for the core API group
    version: str
    plural: str
    namespace: str
    label_selector: str | None = None
    field_selector: str | None = None

    @property
    def path(self) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        return f"{base}/namespaces/{self.namespace}/{self.plural}"

    def item_path(self, name: str) -> str:
        return f"{self.path}/{name}"

    def __str__(self) -> str:
        where = ",".join(s for s in (self.label_selector, self.field_selector) if s)
        kind = f"{self.plural}.{self.group}" if self.group else self.plural
        return f"{kind} in {self.namespace}" + (f" [{where}]" if where else "")

    def query(self) -> list[tuple[str, str]]:
        params = []
        if self.label_selector:
            params.append(("labelSelector", self.label_selector))
        if self.field_selector:
            params.append(("fieldSelector", self.field_selector))
        return params


@dataclass(frozen=True, slots=True)
class ListResult:
    items: list[dict[str, Any]]
    resource_version: str


class KubeApi:
    """list/watch over an ApiClient. Does not own the client."""

    def __init__(self, client: kclient.ApiClient, *, request_timeout_s: float = 30.0) -> None:
        self._client = client
        self._request_timeout_s = request_timeout_s

    async def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        client_timeout: aiohttp.ClientTimeout,
        body: dict[str, Any] | None = None,
    ) -> Any:
        try:
            return await self._client.call_api(
                path,
                method,
                query_params=query,
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=client_timeout,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise KubeApiError(0, type(exc).__name__, str(exc)) from exc

    async def _get(self, path: str, query: list[tuple[str, str]], client_timeout: aiohttp.ClientTimeout) -> Any:
        return await self._call("GET", path, query, client_timeout)

    async def _object(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request on one object; its decoded JSON body, or the error its Status names."""
        resp = await self._call(method, path, [], aiohttp.ClientTimeout(total=self._request_timeout_s), body)
        async with resp:
            try:
                decoded = orjson.loads(await resp.read())
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise KubeApiError(0, type(exc).__name__, str(exc)) from exc
            except orjson.JSONDecodeError as exc:
                if not 200 <= resp.status < 300:
                    raise _status_error(resp.status, None) from exc
                raise KubeApiError(resp.status, "BadBody", "response is not JSON") from exc
        if not 200 <= resp.status < 300:
            raise _status_error(resp.status, decoded)
        if not isinstance(decoded, dict):
            raise KubeApiError(resp.status, "BadBody", "response is not an object")
        return decoded

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to an API path (a cluster-scoped create, such as a TokenReview); the decoded answer."""
        return await self._object("POST", path, body)

    async def get(self, resource: Resource, name: str) -> dict[str, Any]:
        """The named object; ``ResourceNotFound`` when there is none."""
        return await self._object("GET", resource.item_path(name))

    async def create(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """POST a new object; the stored object back. ``ResourceConflict`` when the name is taken."""
        return await self._object("POST", resource.path, obj)

    async def replace(self, resource: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """PUT the object (``metadata.name`` names it). With ``metadata.resourceVersion`` set the write is
        conditional: another writer in between ⇒ ``ResourceConflict``."""
        return await self._object("PUT", resource.item_path(str(obj["metadata"]["name"])), obj)

    async def list(self, resource: Resource) -> ListResult:
        """The collection now (a consistent read) and the resourceVersion to watch from."""
        timeout = aiohttp.ClientTimeout(total=self._request_timeout_s)
        resp = await self._get(resource.path, resource.query(), timeout)
        async with resp:
            try:
                body = orjson.loads(await resp.read())
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                raise KubeApiError(0, type(exc).__name__, str(exc)) from exc
            except orjson.JSONDecodeError as exc:
                if resp.status != 200:
                    # A real API server answers an API group it does not serve (a CRD not installed) with a
                    # plain-text 404: the status alone says what happened.
                    raise _status_error(resp.status, None) from exc
                raise KubeApiError(resp.status, "BadBody", "response is not JSON") from exc
        if resp.status != 200:
            raise _status_error(resp.status, body)
        if not isinstance(body, dict) or not isinstance(body.get("items", []), list):
            raise KubeApiError(resp.status, "BadBody", "list response without items")
        rv = str((body.get("metadata") or {}).get("resourceVersion") or "")
        return ListResult([i for i in body.get("items") or () if isinstance(i, dict)], rv)

    async def watch(
        self, resource: Resource, resource_version: str, timeout_s: float
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Events after ``resource_version`` until the server ends the watch (``timeoutSeconds``) or it fails.

        Yields ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK, "object": {...}}``; an ERROR event is raised as the
        error it carries (410 ⇒ ``ResourceGone``).
        """
        query = [
            *resource.query(),
            ("watch", "true"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", resource_version),
            ("timeoutSeconds", str(max(1, int(timeout_s)))),
        ]
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self._request_timeout_s,
            sock_connect=self._request_timeout_s,
            sock_read=timeout_s + _WATCH_READ_SLACK_S,
        )
        resp = await self._get(resource.path, query, timeout)
        async with resp:
            if resp.status != 200:
                try:
                    body = orjson.loads(await resp.read())
                except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError):
                    body = None
                raise _status_error(resp.status, body)
            try:
                async for line in resp.content:
                    if not line.strip():
                        continue
                    event = orjson.loads(line)
                    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
                        raise KubeApiError(200, "BadEvent", f"watch event without object: {line[:200]!r}")
                    if event.get("type") == "ERROR":
                        raise _status_error(500, event["object"])
                    yield event
            except orjson.JSONDecodeError as exc:
                raise KubeApiError(200, "BadEvent", "watch event is not JSON") from exc
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as exc:
                # ValueError: a line longer than the reader's limit (aiohttp's "Chunk too big").
                raise KubeApiError(0, type(exc).__name__, str(exc)) from exc


# --- connection --------------------------------------------------------------------------------------------


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read().strip()


class _ServiceAccountToken:
    """``refresh_api_key_hook`` that re-reads the projected token file (in a thread) once a minute."""

    def __init__(self, token_path: str, token: str, loaded_at: float) -> None:
        self._path = token_path
        self._token = token
        self._loaded_at = loaded_at

    async def __call__(self, configuration: kclient.Configuration) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._loaded_at >= _TOKEN_REFRESH_S:
            try:
                self._token = await asyncio.to_thread(_read_text, self._path)
            except OSError as exc:
                log.warning("kubernetes: cannot re-read the service account token, keeping the old one: %s", exc)
            self._loaded_at = now
        configuration.api_key["BearerToken"] = f"Bearer {self._token}"


async def _in_cluster_configuration() -> kclient.Configuration:
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST", ""), os.environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise KubeApiError(0, "NoConfig", "not in a cluster (KUBERNETES_SERVICE_HOST/PORT unset); give --kubeconfig")
    token_path, ca_path = f"{_SA_DIR}/token", f"{_SA_DIR}/ca.crt"
    try:
        token = await asyncio.to_thread(_read_text, token_path)
    except OSError as exc:
        raise KubeApiError(0, "NoConfig", f"cannot read the service account token: {exc}") from exc
    cfg = kclient.Configuration(host=f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}")
    cfg.ssl_ca_cert = ca_path
    cfg.api_key["BearerToken"] = f"Bearer {token}"
    cfg.refresh_api_key_hook = _ServiceAccountToken(token_path, token, asyncio.get_running_loop().time())
    return cfg


def _load_kubeconfig_in_thread(path: str | None, cfg: kclient.Configuration) -> Any:
    # The loader reads files and may write temporary cert files: keep that off the event loop, in a loop of its own.
    return asyncio.run(kconfig.load_kube_config(config_file=path, client_configuration=cfg, persist_config=False))


def _client(cfg: kclient.Configuration) -> kclient.ApiClient:
    client = kclient.ApiClient(configuration=cfg)
    client.user_agent = "picker-epp"
    return client


@contextlib.asynccontextmanager
async def connect(
    *, api_server: str | None = None, kubeconfig: str | None = None, in_cluster: bool | None = None
) -> AsyncIterator[kclient.ApiClient]:
    """An ApiClient for the first that applies: ``api_server`` (plain URL, no auth: tests, ``kubectl proxy``);
    in-cluster (``in_cluster`` True, or None with no kubeconfig and KUBERNETES_SERVICE_HOST set); kubeconfig
    (``kubeconfig`` or $KUBECONFIG or ~/.kube/config). Closed on exit.
    """
    refresher: asyncio.Task[None] | None = None
    if api_server:
        cfg = kclient.Configuration(host=api_server.rstrip("/"))
    elif in_cluster or (in_cluster is None and not kubeconfig and os.environ.get("KUBERNETES_SERVICE_HOST")):
        cfg = await _in_cluster_configuration()
    else:
        cfg = kclient.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG") or None  # None: ~/.kube/config
        try:
            loader = await asyncio.to_thread(_load_kubeconfig_in_thread, path, cfg)
        except (OSError, kconfig.ConfigException) as exc:
            raise KubeApiError(0, "NoConfig", f"cannot load kubeconfig {path or '~/.kube/config'}: {exc}") from exc
        # Exec-plugin and GCP tokens expire; this loops only for those and returns at once otherwise.
        refresher = asyncio.create_task(kconfig.refresh_token(loader, cfg), name="kube-token-refresh")
    client = _client(cfg)
    try:
        yield client
    finally:
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await refresher
        await client.close()
