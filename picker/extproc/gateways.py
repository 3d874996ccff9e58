"""Gateway profiles and body modes: what differs between Envoy, NGINX Gateway Fabric and agentgateway.

* **envoy**: the first message carries ``protocol_config`` (Envoy ≥ 1.33) naming the request and response body
  modes; without it FULL_DUPLEX_STREAMED (the reference configuration) is assumed.
* **nginx** (NGINX Gateway Fabric's Go shim): no ``protocol_config``; header values in ``value`` strings, keys
  lower-cased, in any order; no pseudo-headers, no ``host``; one body message with EOS, then half-close; no
  metadata, no response phases; it reads only the ``raw_value`` of the ``x-gateway-destination-endpoint`` entry of
  the *request-headers* response. So picker holds that response until the body is in, and sends nothing else
  (the shim would drop body chunks anyway).
* **agentgateway**: full duplex both ways; uses the first endpoint of the destination list only.

``auto`` recognises the shim by its ``value`` strings when no ``protocol_config`` came; agentgateway can't be
told from Envoy on the wire, so ``--gateway-profile agentgateway`` selects it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2

__all__ = ["AGENTGATEWAY", "ENVOY", "NGINX", "PROFILES", "BodyMode", "Profile", "body_mode", "choose"]

_SEND = processing_mode_pb2.ProcessingMode


class BodyMode(enum.Enum):
    """How the proxy sends a body, reduced to what changes picker's behaviour."""

    FULL_DUPLEX = "full-duplex"  # chunks without waiting; picker may hold the headers answer; body echoed back
    BUFFERED = "buffered"  # headers answered at once; one body message; routing rides on the body answer
    STREAMED = "streamed"  # headers answered before any body chunk: routing must be decided from headers
    NONE = "none"  # the body is not sent to picker at all: also decided from headers


_MODES = {
    _SEND.NONE: BodyMode.NONE,
    _SEND.STREAMED: BodyMode.STREAMED,
    _SEND.BUFFERED: BodyMode.BUFFERED,
    # BUFFERED_PARTIAL: one (possibly truncated) body message answered like BUFFERED; see stream.py.
    _SEND.BUFFERED_PARTIAL: BodyMode.BUFFERED,
    _SEND.FULL_DUPLEX_STREAMED: BodyMode.FULL_DUPLEX,
    _SEND.GRPC: BodyMode.FULL_DUPLEX,
}


def body_mode(value: int) -> BodyMode:
    return _MODES.get(value, BodyMode.FULL_DUPLEX)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    echo_request_body: bool  # send the request body back (FULL_DUPLEX): the shim doesn't read it
    first_endpoint_only: bool  # the gateway ignores fallbacks in the destination list


ENVOY = Profile("envoy", echo_request_body=True, first_endpoint_only=False)
NGINX = Profile("nginx", echo_request_body=False, first_endpoint_only=True)
AGENTGATEWAY = Profile("agentgateway", echo_request_body=True, first_endpoint_only=True)
PROFILES = {p.name: p for p in (ENVOY, NGINX, AGENTGATEWAY)}


def choose(setting: str, *, has_protocol_config: bool, value_strings: bool) -> Profile:
    """The profile of one stream: the configured one, or (``auto``) recognised from the first message."""
    if setting != "auto":
        return PROFILES[setting]
    if not has_protocol_config and value_strings:
        return NGINX
    return ENVOY
