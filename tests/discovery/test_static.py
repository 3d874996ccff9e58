from __future__ import annotations

import json
from pathlib import Path

import pytest

from picker import errors
from picker.discovery.static import load_endpoints_file, parse_endpoints, publish_static, to_endpoints
from picker.endpoints.store import EndpointStore
from picker.settings import StaticEndpoint


def test_plain_list_ipv4_and_bracketed_ipv6() -> None:
    assert parse_endpoints("10.0.0.1:8000, 10.0.0.2:8001,[FD00::1]:8000,") == (
        StaticEndpoint("10.0.0.1", 8000),
        StaticEndpoint("10.0.0.2", 8001),
        StaticEndpoint("fd00::1", 8000),  # normalised
    )


def test_metrics_url_engine_and_name_options() -> None:
    (ep,) = parse_endpoints("10.0.0.1:8000@http://10.0.0.1:9400/metrics;engine=SGLang;name=gpu-1")
    assert ep == StaticEndpoint("10.0.0.1", 8000, "http://10.0.0.1:9400/metrics", engine="sglang", name="gpu-1")


def test_empty_spec_is_empty() -> None:
    assert parse_endpoints(" ") == ()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("10.0.0.1", "lacks ':port'"),
        ("10.0.0.1:0", "port"),
        ("10.0.0.1:65536", "port"),
        ("10.0.0.1:http", "port"),
        ("model-server:8000", "not an IP address"),
        ("10.0.0.300:8000", "not an IP address"),
        ("fd00::1:8000", "brackets"),
        ("[fd00::1:8000", "ipv6"),
        ("10.0.0.1:8000,10.0.0.1:8000", "duplicate endpoint 10.0.0.1:8000"),
        ("[fd00::1]:80,[fd00:0::1]:80", "duplicate endpoint \\[fd00::1\\]:80"),
        ("10.0.0.1:8000@ftp://x/metrics", "metrics URL"),
        ("10.0.0.1:8000@/metrics", "metrics URL"),
        ("10.0.0.1:8000;weight=2", "unknown option"),
        ("10.0.0.1:8000;engine=v llm", "engine"),
    ],
)
def test_bad_specs_raise_config_error(spec: str, message: str) -> None:
    with pytest.raises(errors.ConfigError, match=message):
        parse_endpoints(spec)


def test_to_endpoints_defaults_the_metrics_url() -> None:
    eps = to_endpoints(
        [
            StaticEndpoint("10.0.0.1", 8000),
            StaticEndpoint("fd00::1", 8000, engine="sglang", labels=(("zone", "a"),)),
            StaticEndpoint("10.0.0.2", 8000, metrics_url="https://10.0.0.2:9443/metrics", name="two"),
        ]
    )
    assert [e.key for e in eps] == ["10.0.0.1:8000", "[fd00::1]:8000", "10.0.0.2:8000"]
    assert [e.metrics_url for e in eps] == [
        "http://10.0.0.1:8000/metrics",
        "http://[fd00::1]:8000/metrics",
        "https://10.0.0.2:9443/metrics",
    ]
    assert (eps[1].engine, dict(eps[1].labels)) == ("sglang", {"zone": "a"})
    assert [e.name for e in eps] == ["10.0.0.1:8000", "[fd00::1]:8000", "two"]


def test_publish_marks_the_store_synced() -> None:
    store = EndpointStore()
    snap = publish_static(store, parse_endpoints("10.0.0.1:8000,10.0.0.2:8000"))
    assert snap.synced
    assert store.current() is snap
    assert [e.key for e in snap] == ["10.0.0.1:8000", "10.0.0.2:8000"]


def test_yaml_file_with_mappings_and_strings(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(
        """
endpoints:
  - address: 10.0.0.1
    port: 8000
    engine: trtllm-serve
    name: a
    labels: {zone: "1"}
  - address: "[fd00::2]"
    port: 8001
    metricsUrl: http://[fd00::2]:9000/metrics
  - 10.0.0.3:8000;engine=sglang
""",
        encoding="utf-8",
    )
    assert load_endpoints_file(path) == (
        StaticEndpoint("10.0.0.1", 8000, engine="trtllm-serve", name="a", labels=(("zone", "1"),)),
        StaticEndpoint("fd00::2", 8001, metrics_url="http://[fd00::2]:9000/metrics"),
        StaticEndpoint("10.0.0.3", 8000, engine="sglang"),
    )


def test_json_file_as_a_plain_list(tmp_path: Path) -> None:
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps([{"address": "10.0.0.1", "port": 8000}]), encoding="utf-8")
    assert load_endpoints_file(path) == (StaticEndpoint("10.0.0.1", 8000),)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("address: 10.0.0.1", "expected a list"),
        ("[{address: 10.0.0.1, port: 8000, weight: 2}]", "unknown keys \\['weight'\\]"),
        ("[{port: 8000}]", "'address'"),
        ("[{address: 10.0.0.1, port: 0}]", "port"),
        ("[{address: 10.0.0.1, port: true}]", "port"),
        ("[{address: host.example, port: 8000}]", "not an IP address"),
        ("[{address: 10.0.0.1, port: 8000, labels: {zone: 1}}]", "labels"),
        ("[{address: 10.0.0.1, port: 8000}, '10.0.0.1:8000']", "duplicate endpoint"),
        ("[42]", "item 0: expected a mapping"),
        ("[{address: 10.0.0.1, port: 8000", "not YAML"),
    ],
)
def test_bad_files_raise_config_error(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "endpoints.yaml"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(errors.ConfigError, match=message):
        load_endpoints_file(path)


def test_missing_file_raises_config_error(tmp_path: Path) -> None:
    with pytest.raises(errors.ConfigError, match="No such file"):
        load_endpoints_file(tmp_path / "nope.yaml")
