"""``--metrics-endpoint-auth``: who may read ``/metrics``, asked of the Kubernetes API as the reference EPP does.

A scrape's ``Authorization: Bearer <token>`` is sent in a ``TokenReview`` (authentication.k8s.io/v1): is the
token valid, and whose is it? The identity then goes into a ``SubjectAccessReview`` (authorization.k8s.io/v1):
may it ``get`` the non-resource URL ``/metrics``? Allowed ⇒ 200; no, unknown or expired token ⇒ 401; a valid
identity without the right ⇒ 403 (controller-runtime's ``WithAuthenticationAndAuthorization``, which the
reference uses). The RBAC this needs (``tokenreviews`` and ``subjectaccessreviews`` create, in a ClusterRole) is
``rbac.METRICS_AUTH_RULES``; a Prometheus reading picker needs ``get`` on the nonResourceURL ``/metrics``.

Answers are cached by the token's SHA-256 (never the token itself): allowed for 60 s, refused for 10 s, at most
``max_cached`` tokens, so a Prometheus scraping every few seconds costs two API calls a minute and a flood of
random tokens cannot grow memory without bound. When the API does not answer, the scrape is refused (401, not
cached; logged once per failure streak): a down API server closes the endpoint rather than opening it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from picker.discovery import kubeapi
from picker.discovery.kubesettings import KubeSettings
from picker.telemetry.metricsauth import Verdict, bearer_token

__all__ = ["METRICS_PATH", "SUBJECT_ACCESS_REVIEWS", "TOKEN_REVIEWS", "Reviewer"]

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
SUBJECT_ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
METRICS_PATH = "/metrics"
_ALLOWED_TTL_S = 60.0
_DENIED_TTL_S = 10.0


class Reviewer:
    def __init__(
        self,
        kube: KubeSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_cached: int = 1024,
    ) -> None:
        self._kube = kube
        self._clock = clock
        self._max_cached = max_cached
        self._cache: OrderedDict[bytes, tuple[Verdict, float]] = OrderedDict()
        self._stack: contextlib.AsyncExitStack | None = None
        self._api: kubeapi.KubeApi | None = None
        self._failing = False
        self._connecting = asyncio.Lock()  # two first scrapes at once must not open two clients

    async def close(self) -> None:
        if self._stack is not None:
            await self._stack.aclose()
            self._stack = self._api = None

    async def _connect(self) -> kubeapi.KubeApi:
        async with self._connecting:
            if self._api is None:
                stack = contextlib.AsyncExitStack()
                kube = self._kube
                client = await stack.enter_async_context(
                    kubeapi.connect(api_server=kube.api_server, kubeconfig=kube.kubeconfig, in_cluster=kube.in_cluster)
                )
                self._stack, self._api = stack, kubeapi.KubeApi(client, request_timeout_s=5.0)
            return self._api

    async def verdict(self, authorization: str | None) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict.UNAUTHENTICATED
        key = hashlib.sha256(token.encode()).digest()
        now = self._clock()
        cached = self._cache.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        try:
            verdict = await self._review(token)
        except kubeapi.KubeApiError as exc:
            if not self._failing:
                log.warning("metrics auth: the Kubernetes API did not answer; refusing scrapes: %s", exc)
            self._failing = True
            return Verdict.UNAUTHENTICATED
        if self._failing:
            log.info("metrics auth: the Kubernetes API answers again")
            self._failing = False
        self._cache[key] = (verdict, now + (_ALLOWED_TTL_S if verdict is Verdict.ALLOWED else _DENIED_TTL_S))
        self._cache.move_to_end(key)
        while len(self._cache) > self._max_cached:
            self._cache.popitem(last=False)
        return verdict

    async def _review(self, token: str) -> Verdict:
        api = await self._connect()
        review = await api.post(
            TOKEN_REVIEWS,
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
        )
        status: dict[str, Any] = review.get("status") or {}
        if status.get("authenticated") is not True:
            return Verdict.UNAUTHENTICATED
        user: dict[str, Any] = status.get("user") or {}
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": user.get("groups") or [],
            "nonResourceAttributes": {"path": METRICS_PATH, "verb": "get"},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = await api.post(
            SUBJECT_ACCESS_REVIEWS,
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec},
        )
        allowed = (access.get("status") or {}).get("allowed") is True
        return Verdict.ALLOWED if allowed else Verdict.FORBIDDEN
