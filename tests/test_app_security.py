"""The metrics endpoint's auth options as a scraper sees them over HTTP."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from picker import app, errors
from picker.app import serving
from picker.bench import procs
from picker.discovery.kubesettings import KubeSettings
from tests.extproc.conftest import settings
from tests.kube.apiserver import FakeApiServer
from tests.kube.objects import pool


def free_port() -> int:
    return procs.free_port()  # outside the ephemeral range: no outgoing connection takes it meanwhile


async def scrape(port: int, authorization: str | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": authorization} if authorization else {}
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def test_static_token_guards_metrics(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret")
    port = free_port()
    async with serving(settings(metrics_port=port, metrics_auth_token_file=str(token)), scrape=False):
        status, headers, _ = await scrape(port)
        assert (status, headers.get("WWW-Authenticate")) == (401, "Bearer")
        assert (await scrape(port, "Bearer nope"))[0] == 401
        status, _, body = await scrape(port, "Bearer s3cret")
        assert status == 200
        assert b"inference_extension_info" in body


async def test_static_token_guards_pprof_too(tmp_path: Path) -> None:
    """--enable-pprof's /debug/pprof/ is on the metrics port: the same token guards it (as the reference's filter)."""
    token = tmp_path / "token"
    token.write_text("s3cret")
    port = free_port()
    s = settings(metrics_port=port, metrics_auth_token_file=str(token), enable_pprof=True)
    async with serving(s, scrape=False), aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{port}/debug/pprof/goroutine"
        async with http.get(url) as r:
            assert r.status == 401
        async with http.get(url, headers={"Authorization": "Bearer s3cret"}) as r:
            assert r.status == 200
            assert "asyncio tasks:" in await r.text()


async def test_kubernetes_token_review_guards_metrics() -> None:
    async with FakeApiServer() as api:
        api.create("inferencepools", pool(ports=(8000,)))
        api.tokens = {"prom": {"username": "prometheus"}, "other": {"username": "someone"}}
        api.non_resource_grants = {("prometheus", "get", "/metrics")}
        port = free_port()
        kube = KubeSettings(pool_name="pool", api_server=api.url)
        async with serving(settings(metrics_port=port, metrics_endpoint_auth=True), kube=kube, scrape=False):
            assert (await scrape(port))[0] == 401
            assert (await scrape(port, "Bearer forged"))[0] == 401
            assert (await scrape(port, "Bearer other"))[0] == 403
            assert (await scrape(port, "Bearer prom"))[0] == 200


async def test_both_auth_options_at_once_are_refused(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("x")
    with pytest.raises(errors.ConfigError, match="not both"):
        async with serving(
            settings(metrics_port=free_port(), metrics_auth_token_file=str(token), metrics_endpoint_auth=True),
            scrape=False,
        ):
            pass


def test_security_flags_parse(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser()
    app.configure(parser)
    args = parser.parse_args(
        [
            "--cert-path", "/c", "--enable-cert-reload=false", "--client-ca-file", "/ca.pem",
            "--metrics-auth-token-file", "/t", "--max-header-bytes", "1000", "--retry-after", "3",
        ]
    )  # fmt: skip
    srv = app.settings_from_args(args).server
    assert (srv.cert_path, srv.cert_reload, srv.client_ca_file) == ("/c", False, "/ca.pem")
    assert (srv.metrics_auth_token_file, srv.metrics_endpoint_auth) == ("/t", False)
    assert (srv.max_header_bytes, srv.retry_after_s) == (1000, 3)
    assert app.settings_from_args(parser.parse_args(["--metrics-endpoint-auth"])).server.metrics_endpoint_auth
