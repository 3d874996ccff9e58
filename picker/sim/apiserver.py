"""A stand-in Kubernetes API server for tests and benchmarks (aiohttp, 127.0.0.1): the list/watch protocol, faithfully.

What it speaks, for pods and events (core/v1), leases (``coordination.k8s.io/v1``), endpointslices
(``discovery.k8s.io/v1``) and the custom resources
InferencePool (v1 and v1alpha2), InferenceObjective and InferenceModelRewrite
(``inference.networking.x-k8s.io/v1alpha2``), namespaced:

- ``GET …/namespaces/{ns}/{plural}``: a JSON list (``kind: <Kind>List``) with ``metadata.resourceVersion``;
  ``labelSelector`` (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, comma = AND) and ``fieldSelector``
  (``metadata.name``, ``metadata.namespace`` with ``=``/``==``/``!=``) filter it. ``resourceVersion`` with
  ``resourceVersionMatch=Exact`` older than the compaction point ⇒ HTTP 410.
- ``GET …/{plural}/{name}``: one object, or a 404 Status.
- ``?watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=T``: a chunked stream of
  ``{"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": …}`` lines. From N the server replays every later
  change from its history, then streams live ones; without N (or N="0") it first sends a synthetic ADDED per
  existing object. As with the real watch cache, an object that stops matching the selector arrives as DELETED
  and one that starts matching as ADDED. Bookmarks (only when allowed) carry the current resourceVersion, every
  ``bookmark_interval_s`` and on ``send_bookmarks()``. The stream ends cleanly after T seconds.
- 410 Gone: a watch from a version older than the compaction point gets an ERROR event with a 410 ``Expired``
  Status (``gone_mode="event"``, what a real apiserver does) or an HTTP 410 (``gone_mode="http"``);
  ``expire_watches()`` sends that ERROR to every open watch, as an apiserver does to a watcher that fell behind.
- Writes: ``POST …/{plural}`` creates (``metadata.name``, or ``generateName`` plus 5 random characters; a taken
  name ⇒ 409 ``AlreadyExists``); ``PUT …/{plural}/{name}`` replaces — conditionally when the body carries
  ``metadata.resourceVersion``: a stale one ⇒ 409 ``Conflict``, as optimistic concurrency works on a real
  apiserver; without one the update is unconditional; no such object ⇒ 404; ``DELETE …/{plural}/{name}`` ⇒ a
  Success Status, or 404. Each bumps the resourceVersion and reaches open watches like a Python-API change.
- Reviews (cluster-scoped creates, answered and not stored): ``POST /apis/authentication.k8s.io/v1/tokenreviews``
  authenticates ``spec.token`` against ``tokens`` (token → user info); ``POST
  /apis/authorization.k8s.io/v1/subjectaccessreviews`` allows a ``nonResourceAttributes`` request when
  ``(user, verb, path)`` is in ``non_resource_grants`` (or a group of the user is, as ``group:<name>``). Both are
  recorded in ``requests`` as verb ``create`` on ``tokenreviews.authentication.k8s.io`` /
  ``subjectaccessreviews.authorization.k8s.io``.
- A CRD that is "not installed" answers 404 (Status ``NotFound``) to list, get and watch; uninstalling one ends its
  open watches and drops its objects.

Test API (call from the test's event loop): ``create``/``replace``/``patch``/``delete`` objects (the
resourceVersion is one global counter, incremented per change), ``compact()``, ``cut_watches()`` (abort every
open watch connection mid-stream), ``expire_watches()``, ``set_installed(resource, bool)``, ``fail_next(...)``
(answer the next requests with an error status; verbs list, watch, get, create, update, delete),
``send_bookmarks()``, ``go_down()``/``come_back()`` (the port closes, then reopens);
``requests`` records every call, ``count(verb, resource)`` counts them and
``verbs(resource)`` lists the verbs used (the RBAC a client needs), ``responses`` keeps the (verb, resource, HTTP
status) of every get and write, ``authorizations`` the Authorization headers; ``wait_watching(resource)`` waits
until a watch is open.

Not modelled: authentication and authorization (no token is checked, no RBAC), admission, defaulting and
validation (objects are stored as given), PATCH over HTTP, delete preconditions and options, server-side apply
and managedFields, generation/observedGeneration, finalizers and graceful deletion (a
test sets ``deletionTimestamp`` itself), field selectors other than ``metadata.name``/``metadata.namespace``,
set-based label selectors (``in``, ``notin``), pagination (``limit``/``continue`` are answered with 400),
``sendInitialEvents``/watch-list streaming, ``resourceVersionMatch=NotOlderThan`` waits, cluster-scoped and
all-namespaces requests, protobuf or YAML encoding, discovery documents (``/apis``), status subresources,
HTTP/2, and watch-cache window limits other than the explicit ``compact()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

__all__ = ["RESOURCES", "FakeApiServer", "ResourceType"]

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class ResourceType:
    group: str  # "" = core
    version: str
    plural: str
    kind: str
    crd: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


RESOURCES: tuple[ResourceType, ...] = (
    ResourceType("", "v1", "pods", "Pod", crd=False),
    ResourceType("", "v1", "events", "Event", crd=False),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", crd=False),
    ResourceType("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice", crd=False),
    ResourceType("inference.networking.k8s.io", "v1", "inferencepools", "InferencePool"),
    ResourceType("inference.networking.x-k8s.io", "v1alpha2", "inferencepools", "InferencePool"),
    ResourceType("inference.networking.x-k8s.io", "v1alpha2", "inferenceobjectives", "InferenceObjective"),
    ResourceType("inference.networking.x-k8s.io", "v1alpha2", "inferencemodelrewrites", "InferenceModelRewrite"),
)


def status(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _json(code: int, body: Obj) -> web.Response:
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


# --- selectors ---------------------------------------------------------------------------------------------

Requirement = tuple[str, str, str]  # (key, op, value); op in "=", "!=", "exists", "!exists"


def _parse_selector(text: str, *, fields: bool) -> list[Requirement]:
    reqs: list[Requirement] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if " in " in part or " notin " in part or "(" in part:
            raise ValueError(f"set-based selector {part!r} is not modelled")
        if "!=" in part:
            key, value = part.split("!=", 1)
            reqs.append((key.strip(), "!=", value.strip()))
        elif "=" in part:
            key, value = part.split("==", 1) if "==" in part else part.split("=", 1)
            reqs.append((key.strip(), "=", value.strip()))
        elif fields:
            raise ValueError(f"field selector {part!r} needs an operator")
        elif part.startswith("!"):
            reqs.append((part[1:].strip(), "!exists", ""))
        else:
            reqs.append((part, "exists", ""))
    if fields:
        for key, _, _ in reqs:
            if key not in ("metadata.name", "metadata.namespace"):
                raise ValueError(f'field label not supported: "{key}"')
    return reqs


def _matches(obj: Obj, labels: list[Requirement], fields: list[Requirement]) -> bool:
    meta = obj.get("metadata") or {}
    have = meta.get("labels") or {}
    for key, op, value in labels:
        ok = {
            "=": have.get(key) == value,
            "!=": have.get(key) != value,
            "exists": key in have,
            "!exists": key not in have,
        }[op]
        if not ok:
            return False
    for key, op, value in fields:
        actual = meta.get(key.removeprefix("metadata."), "")
        if (actual == value) != (op == "="):
            return False
    return True


# --- watches ----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Change:
    rv: int
    rtype: ResourceType
    namespace: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj
    old: Obj | None


@dataclass(eq=False)
class _Watch:
    rtype: ResourceType
    namespace: str
    labels: list[Requirement]
    fields: list[Requirement]
    bookmarks: bool
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)

    def offer(self, change: _Change) -> None:
        """Queue what this watcher should see of ``change`` (selector transitions become ADDED/DELETED)."""
        if change.rtype != self.rtype or change.namespace != self.namespace:
            return
        now = _matches(change.obj, self.labels, self.fields)
        before = change.old is not None and _matches(change.old, self.labels, self.fields)
        if change.type == "ADDED":
            kind = "ADDED" if now else None
        elif change.type == "DELETED":
            kind = "DELETED" if now else None
        elif before and now:
            kind = "MODIFIED"
        elif now:
            kind = "ADDED"
        elif before:
            kind = "DELETED"
        else:
            kind = None
        if kind is not None:
            self.queue.put_nowait(("event", {"type": kind, "object": change.obj}))


@dataclass(slots=True)
class _Failure:
    verb: str  # list | watch | get | create | update | delete
    rtype: ResourceType
    code: int
    remaining: int


class FakeApiServer:
    """See the module docstring. ``async with FakeApiServer() as api: api.url``."""

    def __init__(
        self,
        *,
        bookmark_interval_s: float | None = None,
        gone_mode: str = "event",
        default_watch_timeout_s: float = 60.0,
        start_rv: int = 1000,
    ) -> None:
        self.bookmark_interval_s = bookmark_interval_s
        self.gone_mode = gone_mode
        self.default_watch_timeout_s = default_watch_timeout_s
        self.rv = start_rv
        self.compacted_rv = start_rv  # watches from an older version get 410
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (verb, resource name, query)
        self.authorizations: list[str | None] = []  # the Authorization header of every request
        self.responses: list[tuple[str, str, int]] = []  # (verb, resource name, HTTP status) of gets and writes
        self._objects: dict[ResourceType, dict[tuple[str, str], Obj]] = {r: {} for r in RESOURCES}
        self._installed: dict[ResourceType, bool] = {r: True for r in RESOURCES}
        self._history: list[_Change] = []
        self._watches: set[_Watch] = set()
        self._failures: list[_Failure] = []
        self._watch_opened = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._port = 0
        self.url = ""
        self.tokens: dict[str, Obj] = {}  # TokenReview: token -> status.user ({"username", "uid", "groups"})
        self.non_resource_grants: set[tuple[str, str, str]] = set()  # SubjectAccessReview: (user, verb, path)

    # --- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> str:
        app = web.Application()
        for prefix in ("/api/{version}", "/apis/{group}/{version}"):
            app.router.add_get(prefix + "/namespaces/{ns}/{plural}", self._collection)
            app.router.add_post(prefix + "/namespaces/{ns}/{plural}", self._create)
            app.router.add_get(prefix + "/namespaces/{ns}/{plural}/{name}", self._item)
            app.router.add_put(prefix + "/namespaces/{ns}/{plural}/{name}", self._update)
            app.router.add_delete(prefix + "/namespaces/{ns}/{plural}/{name}", self._delete)
        app.router.add_post("/apis/authentication.k8s.io/v1/tokenreviews", self._token_review)
        app.router.add_post("/apis/authorization.k8s.io/v1/subjectaccessreviews", self._access_review)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await self._site.start()
        host, port = self._runner.addresses[0][:2]
        self._port = port
        self.url = f"http://{host}:{port}"
        return self.url

    async def go_down(self) -> None:
        """The API server becomes unreachable: the port closes and every open connection (watches too) is cut.
        Objects may still be changed through the test API meanwhile; ``come_back`` reopens the same port."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        self.cut_watches()
        if self._runner is not None and self._runner.server is not None:
            for conn in list(self._runner.server.connections):
                if conn.transport is not None:
                    conn.transport.abort()

    async def come_back(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self._port, reuse_address=True)
        await self._site.start()

    async def close(self) -> None:
        for watch in list(self._watches):
            watch.queue.put_nowait(("end", None))
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> FakeApiServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- test API --------------------------------------------------------------------------------------------

    def resource(self, name: str) -> ResourceType:
        """``"pods"``, ``"inferencepools"`` (v1) or ``"<plural>.<group>"``."""
        for r in RESOURCES:
            if name in (r.name, r.plural):
                return r
        raise KeyError(name)

    def _bump(self) -> int:
        self.rv += 1
        return self.rv

    def _record(self, rtype: ResourceType, namespace: str, kind: str, obj: Obj, old: Obj | None) -> None:
        change = _Change(self.rv, rtype, namespace, kind, copy.deepcopy(obj), copy.deepcopy(old) if old else None)
        self._history.append(change)
        for watch in list(self._watches):
            watch.offer(change)

    def create(self, resource: str, obj: Obj) -> Obj:
        rtype = self.resource(resource)
        if not self._installed[rtype]:
            raise LookupError(f"{rtype.name} is not installed")
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        ns = meta.setdefault("namespace", "default")
        key = (ns, meta["name"])
        if key in self._objects[rtype]:
            raise FileExistsError(f"{rtype.name} {ns}/{meta['name']} exists")
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["resourceVersion"] = str(self._bump())
        self._objects[rtype][key] = obj
        self._record(rtype, ns, "ADDED", obj, None)
        return copy.deepcopy(obj)

    def replace(self, resource: str, obj: Obj) -> Obj:
        rtype = self.resource(resource)
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        ns = meta.setdefault("namespace", "default")
        old = self._objects[rtype][(ns, meta["name"])]
        for kept in ("uid", "creationTimestamp"):
            meta[kept] = old["metadata"][kept]
        obj.setdefault("apiVersion", rtype.api_version)
        obj.setdefault("kind", rtype.kind)
        meta["resourceVersion"] = str(self._bump())
        self._objects[rtype][(ns, meta["name"])] = obj
        self._record(rtype, ns, "MODIFIED", obj, old)
        return copy.deepcopy(obj)

    def patch(self, resource: str, name: str, mutate: Callable[[Obj], None], namespace: str = "default") -> Obj:
        """Apply ``mutate`` to a copy of the object and store it (one MODIFIED)."""
        obj = copy.deepcopy(self.get(resource, name, namespace))
        mutate(obj)
        return self.replace(resource, obj)

    def delete(self, resource: str, name: str, namespace: str = "default") -> None:
        rtype = self.resource(resource)
        old = self._objects[rtype].pop((namespace, name))
        final = copy.deepcopy(old)
        final["metadata"]["resourceVersion"] = str(self._bump())
        self._record(rtype, namespace, "DELETED", final, old)

    def get(self, resource: str, name: str, namespace: str = "default") -> Obj:
        return copy.deepcopy(self._objects[self.resource(resource)][(namespace, name)])

    def compact(self) -> None:
        """Forget all history up to now: watches from any older version get 410."""
        self.compacted_rv = self.rv
        self._history.clear()

    def cut_watches(self) -> int:
        """Abort every open watch connection mid-stream (no clean end of the chunked body)."""
        for watch in self._watches:
            watch.queue.put_nowait(("cut", None))
        return len(self._watches)

    def expire_watches(self) -> int:
        """Send every open watch an ERROR 410 Expired event and end it."""
        for watch in self._watches:
            watch.queue.put_nowait(("expire", None))
        return len(self._watches)

    def send_bookmarks(self) -> int:
        for watch in self._watches:
            if watch.bookmarks:
                watch.queue.put_nowait(("bookmark", self.rv))
        return len(self._watches)

    def set_installed(self, resource: str, installed: bool) -> None:
        rtype = self.resource(resource)
        if not rtype.crd:
            raise ValueError(f"{rtype.name} is built in")
        self._installed[rtype] = installed
        if not installed:
            self._objects[rtype].clear()
            for watch in list(self._watches):
                if watch.rtype == rtype:
                    watch.queue.put_nowait(("end", None))

    def fail_next(self, verb: str, resource: str, code: int = 500, times: int = 1) -> None:
        """Answer the next ``times`` ``verb`` requests (list | watch | get) for ``resource`` with ``code``."""
        self._failures.append(_Failure(verb, self.resource(resource), code, times))

    def count(self, verb: str, resource: str) -> int:
        name = self.resource(resource).name
        return sum(1 for v, r, _ in self.requests if v == verb and r == name)

    def verbs(self, resource: str) -> set[str]:
        """Every verb a client used on ``resource`` (the RBAC it would need)."""
        name = self.resource(resource).name
        return {v for v, r, _ in self.requests if r == name}

    def open_watches(self, resource: str) -> int:
        rtype = self.resource(resource)
        return sum(1 for w in self._watches if w.rtype == rtype)

    async def wait_watching(self, resource: str, count: int = 1, timeout_s: float = 5.0) -> None:
        async with asyncio.timeout(timeout_s), self._watch_opened:
            await self._watch_opened.wait_for(lambda: self.open_watches(resource) >= count)

    # --- HTTP ------------------------------------------------------------------------------------------------

    async def _token_review(self, request: web.Request) -> web.Response:
        self.requests.append(("create", "tokenreviews.authentication.k8s.io", {}))
        self.authorizations.append(request.headers.get("Authorization"))
        review = orjson.loads(await request.read())
        user = self.tokens.get(str(review.get("spec", {}).get("token", "")))
        review["status"] = {"authenticated": True, "user": user} if user is not None else {"authenticated": False}
        return _json(201, review)

    async def _access_review(self, request: web.Request) -> web.Response:
        self.requests.append(("create", "subjectaccessreviews.authorization.k8s.io", {}))
        self.authorizations.append(request.headers.get("Authorization"))
        review = orjson.loads(await request.read())
        spec = review.get("spec", {})
        attrs = spec.get("nonResourceAttributes") or {}
        subjects = [spec.get("user", ""), *(f"group:{g}" for g in spec.get("groups") or [])]
        allowed = any((s, attrs.get("verb"), attrs.get("path")) in self.non_resource_grants for s in subjects)
        review["status"] = {"allowed": allowed}
        return _json(201, review)

    def _rtype(self, request: web.Request) -> ResourceType | None:
        info = request.match_info
        group, version, plural = info.get("group", ""), info["version"], info["plural"]
        for r in RESOURCES:
            if (r.group, r.version, r.plural) == (group, version, plural):
                return r
        return None

    def _injected(self, verb: str, rtype: ResourceType) -> web.Response | None:
        for failure in self._failures:
            if failure.verb == verb and failure.rtype == rtype and failure.remaining > 0:
                failure.remaining -= 1
                return _json(failure.code, status(failure.code, "InternalError", "injected failure"))
        return None

    def _not_found(self) -> web.Response:
        return _json(404, status(404, "NotFound", "the server could not find the requested resource"))

    def _gone(self, rv: int) -> Obj:
        return status(410, "Expired", f"too old resource version: {rv} ({self.compacted_rv})")

    def _begin(self, verb: str, request: web.Request) -> tuple[ResourceType | None, web.Response | None]:
        """Record a get or write request; the resource type, or the error response it gets before any work."""
        rtype = self._rtype(request)
        self.requests.append((verb, rtype.name if rtype else "?", dict(request.query)))
        self.authorizations.append(request.headers.get("Authorization"))
        if rtype is None or not self._installed[rtype]:
            return rtype, self._not_found()
        return rtype, self._injected(verb, rtype)

    def _answer(self, verb: str, rtype: ResourceType | None, resp: web.Response) -> web.Response:
        self.responses.append((verb, rtype.name if rtype else "?", resp.status))
        return resp

    async def _body(self, request: web.Request, ns: str) -> Obj:
        try:
            obj = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"body is not JSON: {exc}") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
            raise ValueError("body is not an object")
        meta = obj.setdefault("metadata", {})
        if meta.setdefault("namespace", ns) != ns:
            raise ValueError("the namespace of the provided object does not match the namespace sent on the request")
        return obj

    async def _item(self, request: web.Request) -> web.Response:
        rtype, early = self._begin("get", request)
        if early is not None:
            return self._answer("get", rtype, early)
        assert rtype is not None
        name, ns = request.match_info["name"], request.match_info["ns"]
        obj = self._objects[rtype].get((ns, name))
        if obj is None:
            return self._answer("get", rtype, self._missing(rtype, name))
        return self._answer("get", rtype, _json(200, obj))

    def _missing(self, rtype: ResourceType, name: str) -> web.Response:
        return _json(404, status(404, "NotFound", f'{rtype.name} "{name}" not found'))

    async def _create(self, request: web.Request) -> web.Response:
        rtype, early = self._begin("create", request)
        if early is not None:
            return self._answer("create", rtype, early)
        assert rtype is not None
        ns = request.match_info["ns"]
        try:
            obj = await self._body(request, ns)
        except ValueError as exc:
            return self._answer("create", rtype, _json(400, status(400, "BadRequest", str(exc))))
        meta = obj["metadata"]
        meta.pop("resourceVersion", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        name = meta.get("name")
        if not name:
            return self._answer("create", rtype, _json(422, status(422, "Invalid", "metadata.name: Required value")))
        if (ns, name) in self._objects[rtype]:
            conflict = status(409, "AlreadyExists", f'{rtype.name} "{name}" already exists')
            return self._answer("create", rtype, _json(409, conflict))
        return self._answer("create", rtype, _json(201, self.create(rtype.name, obj)))

    async def _update(self, request: web.Request) -> web.Response:
        rtype, early = self._begin("update", request)
        if early is not None:
            return self._answer("update", rtype, early)
        assert rtype is not None
        name, ns = request.match_info["name"], request.match_info["ns"]
        try:
            obj = await self._body(request, ns)
        except ValueError as exc:
            return self._answer("update", rtype, _json(400, status(400, "BadRequest", str(exc))))
        if obj["metadata"].get("name") != name:
            bad = status(400, "BadRequest", "the name of the object does not match the name on the URL")
            return self._answer("update", rtype, _json(400, bad))
        current = self._objects[rtype].get((ns, name))
        if current is None:
            return self._answer("update", rtype, self._missing(rtype, name))
        sent_rv = obj["metadata"].get("resourceVersion")
        if sent_rv and sent_rv != current["metadata"]["resourceVersion"]:
            message = (
                f'Operation cannot be fulfilled on {rtype.name} "{name}": the object has been modified; '
                "please apply your changes to the latest version and try again"
            )
            return self._answer("update", rtype, _json(409, status(409, "Conflict", message)))
        return self._answer("update", rtype, _json(200, self.replace(rtype.name, obj)))

    async def _delete(self, request: web.Request) -> web.Response:
        rtype, early = self._begin("delete", request)
        if early is not None:
            return self._answer("delete", rtype, early)
        assert rtype is not None
        name, ns = request.match_info["name"], request.match_info["ns"]
        if (ns, name) not in self._objects[rtype]:
            return self._answer("delete", rtype, self._missing(rtype, name))
        self.delete(rtype.name, name, ns)
        done = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": {"name": name}}
        return self._answer("delete", rtype, _json(200, done))

    async def _collection(self, request: web.Request) -> web.StreamResponse:
        rtype = self._rtype(request)
        ns = request.match_info["ns"]
        query = request.query
        watch = query.get("watch") in ("true", "1")
        self.requests.append(("watch" if watch else "list", rtype.name if rtype else "?", dict(query)))
        self.authorizations.append(request.headers.get("Authorization"))
        if rtype is None or not self._installed[rtype]:
            return self._not_found()
        if (injected := self._injected("watch" if watch else "list", rtype)) is not None:
            return injected
        if "limit" in query or "continue" in query:
            return _json(400, status(400, "BadRequest", "pagination is not modelled by the stand-in server"))
        try:
            labels = _parse_selector(query.get("labelSelector", ""), fields=False)
            fields = _parse_selector(query.get("fieldSelector", ""), fields=True)
            rv = int(query["resourceVersion"]) if query.get("resourceVersion") else 0
        except ValueError as exc:
            return _json(400, status(400, "BadRequest", str(exc)))
        if watch:
            return await self._watch(request, rtype, ns, labels, fields, rv)
        if query.get("resourceVersionMatch") == "Exact" and rv and rv < self.compacted_rv:
            return _json(410, self._gone(rv))
        items = [
            copy.deepcopy(o)
            for (o_ns, _), o in sorted(self._objects[rtype].items())
            if o_ns == ns and _matches(o, labels, fields)
        ]
        body = {
            "kind": f"{rtype.kind}List",
            "apiVersion": rtype.api_version,
            "metadata": {"resourceVersion": str(self.rv)},
            "items": items,
        }
        return _json(200, body)

    async def _watch(
        self,
        request: web.Request,
        rtype: ResourceType,
        ns: str,
        labels: list[Requirement],
        fields: list[Requirement],
        rv: int,
    ) -> web.StreamResponse:
        query = request.query
        if rv and rv < self.compacted_rv and self.gone_mode == "http":
            return _json(410, self._gone(rv))
        watch = _Watch(rtype, ns, labels, fields, query.get("allowWatchBookmarks") == "true")
        if rv and rv < self.compacted_rv:
            watch.queue.put_nowait(("expire", rv))
        elif rv:
            for change in self._history:
                if change.rv > rv:
                    watch.offer(change)
        else:
            for (o_ns, _), obj in sorted(self._objects[rtype].items()):
                if o_ns == ns and _matches(obj, labels, fields):
                    watch.queue.put_nowait(("event", {"type": "ADDED", "object": copy.deepcopy(obj)}))
        self._watches.add(watch)  # same loop turn as the replay: no change can fall in between
        try:
            return await self._stream(
                request, watch, float(query.get("timeoutSeconds") or self.default_watch_timeout_s)
            )
        finally:
            self._watches.discard(watch)

    async def _stream(self, request: web.Request, watch: _Watch, timeout_s: float) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        async with self._watch_opened:
            self._watch_opened.notify_all()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        interval = self.bookmark_interval_s if watch.bookmarks else None
        next_bookmark = loop.time() + interval if interval else float("inf")
        try:
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                try:
                    async with asyncio.timeout(min(deadline, next_bookmark) - now):
                        what, payload = await watch.queue.get()
                except TimeoutError:
                    if loop.time() >= next_bookmark and interval:
                        next_bookmark = loop.time() + interval
                        what, payload = "bookmark", self.rv  # the queue is empty: every change is written
                    else:
                        continue
                if what == "event":
                    await resp.write(orjson.dumps(payload) + b"\n")
                elif what == "bookmark":
                    # The version as of when the bookmark was queued: later changes may still be behind it.
                    bookmark: Obj = {
                        "kind": watch.rtype.kind,
                        "apiVersion": watch.rtype.api_version,
                        "metadata": {"resourceVersion": str(payload)},
                    }
                    await resp.write(orjson.dumps({"type": "BOOKMARK", "object": bookmark}) + b"\n")
                elif what == "expire":
                    await resp.write(orjson.dumps({"type": "ERROR", "object": self._gone(payload or 0)}) + b"\n")
                    break
                elif what == "cut":
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                else:  # end
                    break
        except ConnectionError:  # the client went away mid-stream: the watch is over
            return resp
        with contextlib.suppress(ConnectionError):
            await resp.write_eof()
        return resp
