"""session-affinity-scorer (llm-d): keep a session on the endpoint that served its previous request.

Type ``session-affinity-scorer`` (Affinity). Input: the request header ``x-session-token`` = standard base64 of
``namespace/podName`` of the endpoint that served the session before. That endpoint scores 1.0, every other 0.0;
no header, or one that does not decode, ⇒ 0.0 everywhere. An endpoint matches when the decoded token equals
``<namespace>/<name>``, or its part after the last ``/`` equals the endpoint's name (picker's endpoints do not
carry their namespace, and a pool lives in one namespace), or it equals the endpoint's ``ip:port``.

Response side: when the response ends, the EPP tells the client where the session now lives by setting the
response header ``x-session-token`` to ``session_token(served endpoint)`` (a header, not a cookie).
``response_headers(endpoint)`` (the ``ResponseHeaders`` hook) returns that header; picker sets it with a header
mutation on its answer to the response-headers phase, for the endpoint the gateway reports as served (else the
primary target). A gateway that sends picker no response phases (NGINX Gateway Fabric) cannot carry it.

Parameters: ``namespace`` "" (picker's: the namespace written into tokens this EPP issues; the reference uses the
pod's namespace).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import ClassVar

from picker.plugins import Category, CycleState, Endpoint, InferenceRequest, PluginContext, PluginParams
from picker.request import headers as hdr
from picker.scheduling.framework import Scorer
from picker.scheduling.scores import ScoreVector
from picker.scheduling.spec import PluginSpec

__all__ = ["SPEC", "TYPE", "Params", "SessionAffinityScorer", "create", "decode_token", "session_token"]

TYPE = "session-affinity-scorer"


class Params(PluginParams):
    namespace: str = ""


def session_token(endpoint: Endpoint, namespace: str = "") -> str:
    """The ``x-session-token`` value naming ``endpoint``: base64 of ``namespace/name``."""
    return base64.b64encode(f"{namespace}/{endpoint.name}".encode()).decode("ascii")


def decode_token(token: str) -> str | None:
    """The ``namespace/name`` a token names; None if it is not valid base64 of UTF-8 text."""
    try:
        return base64.b64decode(token.strip(), validate=True).decode()
    except (binascii.Error, ValueError):
        return None


class SessionAffinityScorer:
    type: ClassVar[str] = TYPE
    category: ClassVar[Category] = Category.AFFINITY
    __slots__ = ("_namespace", "name")

    def __init__(self, name: str, namespace: str = "") -> None:
        self.name = name
        self._namespace = namespace

    def score(self, req: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState) -> ScoreVector:
        token = req.headers.get(hdr.SESSION_TOKEN)
        target = decode_token(token) if token else None
        if not target:
            return ScoreVector.constant(endpoints, 0.0)
        name = target.rpartition("/")[2]
        return ScoreVector(endpoints, [1.0 if e.name == name or e.key == target else 0.0 for e in endpoints])

    def response_headers(self, endpoint: Endpoint) -> Mapping[str, str]:
        """Headers to set on the response to the client once ``endpoint`` served it."""
        return {hdr.SESSION_TOKEN: session_token(endpoint, self._namespace)}


def create(name: str, params: Params, ctx: PluginContext) -> Scorer:
    return SessionAffinityScorer(name, params.namespace)


SPEC = PluginSpec(TYPE, Params, create)
