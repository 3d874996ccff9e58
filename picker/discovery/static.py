"""Static discovery: a fixed list of model-server endpoints from a flag or a file, published once.

``--endpoints`` takes a comma-separated list; each item is

    ADDRESS:PORT[@METRICS_URL][;engine=ENGINE][;name=NAME]

where ADDRESS is an IPv4 address or a bracketed IPv6 address (``[fd00::1]:8000``); the gateway routes to
``ip:port``, so host names are refused. Examples::

    10.0.0.1:8000,10.0.0.2:8000
    10.0.0.1:8000@http://10.0.0.1:9400/metrics;engine=sglang,[fd00::7]:8000;name=gpu-7

The metrics URL defaults to ``http://ADDRESS:PORT/metrics`` (the reference scrapes ``podIP:targetPort``) and
the engine to ``vllm``. A file (``load_endpoints_file``) is YAML or JSON: a list, or ``{endpoints: [...]}``,
whose items are either strings in the flag syntax or mappings with keys ``address``, ``port`` and optional
``metricsUrl``, ``engine``, ``name``, ``labels`` (string → string). Bad input raises ``errors.ConfigError``
naming the item: not an IP, port outside 1..65535, duplicate ``ip:port``, bad URL, unknown key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from picker import errors
from picker.endpoints.model import Endpoint, EndpointSnapshot, format_hostport
from picker.endpoints.store import EndpointStore
from picker.settings import StaticEndpoint

__all__ = ["load_endpoints_file", "parse_endpoints", "publish_static", "to_endpoints"]

_ENGINE = re.compile(r"[a-z0-9][a-z0-9._-]*\Z")
_FILE_KEYS = frozenset({"address", "port", "metricsUrl", "engine", "name", "labels"})


def parse_endpoints(spec: str) -> tuple[StaticEndpoint, ...]:
    """Parse the ``--endpoints`` flag value; blank items (a trailing comma) are ignored."""
    items = [_parse_item(item.strip()) for item in spec.split(",") if item.strip()]
    return _unique(items)


def load_endpoints_file(path: str | Path) -> tuple[StaticEndpoint, ...]:
    """Read a YAML or JSON endpoints file (see the module docstring)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise errors.ConfigError(f"endpoints file {path}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.ConfigError(f"endpoints file {path}: not YAML/JSON: {exc}") from exc
    if isinstance(doc, Mapping) and set(doc) == {"endpoints"}:
        doc = doc["endpoints"]
    if not isinstance(doc, list):
        raise errors.ConfigError(f"endpoints file {path}: expected a list of endpoints (or {{endpoints: [...]}})")
    items: list[StaticEndpoint] = []
    for i, raw in enumerate(doc):
        where = f"endpoints file {path}, item {i}"
        if isinstance(raw, str):
            items.append(_parse_item(raw.strip(), where=where))
        elif isinstance(raw, Mapping):
            items.append(_from_mapping(raw, where))
        else:
            raise errors.ConfigError(f"{where}: expected a mapping or an 'ip:port' string, got {type(raw).__name__}")
    return _unique(items, where=f"endpoints file {path}")


def to_endpoints(static: Iterable[StaticEndpoint]) -> list[Endpoint]:
    """The store's ``Endpoint`` values; the metrics URL defaults to ``http://ip:port/metrics``."""
    return [
        Endpoint.create(
            s.address,
            s.port,
            name=s.name,
            metrics_url=s.metrics_url or f"http://{format_hostport(s.address, s.port)}/metrics",
            engine=s.engine,
            labels=dict(s.labels),
        )
        for s in static
    ]


def publish_static(store: EndpointStore, endpoints: Iterable[StaticEndpoint]) -> EndpointSnapshot:
    """Publish the fixed membership and mark the store synced (there is nothing more to discover)."""
    return store.set_endpoints(to_endpoints(endpoints), synced=True)


def _parse_item(item: str, *, where: str = "--endpoints") -> StaticEndpoint:
    head, *options = item.split(";")
    hostport, at, metrics_url = head.strip().partition("@")
    address, port = _hostport(hostport.strip(), where)
    engine, name = "vllm", ""
    for option in options:
        key, eq, value = option.partition("=")
        key, value = key.strip(), value.strip()
        if key == "engine" and eq:
            engine = _engine(value, f"{where} item {item!r}")
        elif key == "name" and eq and value:
            name = value
        else:
            raise errors.ConfigError(f"{where}: item {item!r}: unknown option {option!r} (engine=, name=)")
    url = _metrics_url(metrics_url.strip(), f"{where} item {item!r}") if at else None
    return StaticEndpoint(address=address, port=port, metrics_url=url, engine=engine, name=name)


def _from_mapping(raw: Mapping[Any, Any], where: str) -> StaticEndpoint:
    unknown = set(raw) - _FILE_KEYS
    if unknown:
        raise errors.ConfigError(f"{where}: unknown keys {sorted(map(str, unknown))}; known: {sorted(_FILE_KEYS)}")
    address = raw.get("address")
    if not isinstance(address, str):
        raise errors.ConfigError(f"{where}: 'address' (an IP address string) is required")
    address = _ip(address.strip().strip("[]"), where)
    port = _port(raw.get("port"), where)
    url = raw.get("metricsUrl")
    if url is not None and not isinstance(url, str):
        raise errors.ConfigError(f"{where}: 'metricsUrl' must be a string")
    engine = raw.get("engine", "vllm")
    if not isinstance(engine, str):
        raise errors.ConfigError(f"{where}: 'engine' must be a string")
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise errors.ConfigError(f"{where}: 'name' must be a string")
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise errors.ConfigError(f"{where}: 'labels' must map strings to strings (quote numbers in YAML)")
    return StaticEndpoint(
        address=address,
        port=port,
        metrics_url=_metrics_url(url.strip(), where) if url else None,
        engine=_engine(engine, where),
        name=name.strip(),
        labels=tuple(sorted(labels.items())),
    )


def _hostport(text: str, where: str) -> tuple[str, int]:
    if text.startswith("["):
        address, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise errors.ConfigError(f"{where}: {text!r} is not '[ipv6]:port'")
        port_text = rest[1:]
    else:
        address, colon, port_text = text.rpartition(":")
        if not colon:
            raise errors.ConfigError(f"{where}: {text!r} lacks ':port'")
        if ":" in address:
            raise errors.ConfigError(f"{where}: {text!r}: write an IPv6 address in brackets, '[{address}]:{port_text}'")
    return _ip(address, where), _port(port_text, where)


def _ip(address: str, where: str) -> str:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError as exc:
        raise errors.ConfigError(f"{where}: {address!r} is not an IP address (the gateway routes to ip:port)") from exc


def _port(raw: object, where: str) -> int:
    if isinstance(raw, str) and raw.strip().isdigit():
        raw = int(raw.strip())
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= 65535:
        raise errors.ConfigError(f"{where}: port {raw!r} is not an integer in 1..65535")
    return raw


def _metrics_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise errors.ConfigError(f"{where}: metrics URL {url!r} is not an http(s)://host[:port]/path URL")
    return url


def _engine(engine: str, where: str) -> str:
    name = engine.strip().lower()
    if not _ENGINE.match(name):
        raise errors.ConfigError(f"{where}: engine {engine!r} is not a name like vllm, sglang, trtllm-serve, triton")
    return name


def _unique(items: list[StaticEndpoint], *, where: str = "--endpoints") -> tuple[StaticEndpoint, ...]:
    seen: set[str] = set()
    for s in items:
        key = format_hostport(s.address, s.port)
        if key in seen:
            raise errors.ConfigError(f"{where}: duplicate endpoint {key}")
        seen.add(key)
    return tuple(items)
