"""The metrics HTTP server: ``GET /metrics`` (and ``/debug/pprof/`` with ``--enable-pprof``), optionally behind a
bearer-token check (a static token file or Kubernetes TokenReview). ``picker.serve``'s ``--workers`` supervisor
serves its merged page with the same server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from picker import errors
from picker.discovery import kubesettings
from picker.settings import ServerSettings
from picker.telemetry import REGISTRY, metricsauth, pprof

__all__ = ["MetricsAuthorizer", "metrics_authorizer", "start_metrics"]


MetricsAuthorizer = Callable[[str | None], Awaitable[metricsauth.Verdict]]
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def metrics_authorizer(
    srv: ServerSettings, kube: kubesettings.KubeSettings | None
) -> tuple[MetricsAuthorizer | None, Callable[[], Awaitable[None]] | None]:
    """``--metrics-auth-token-file`` (a static token) or ``--metrics-endpoint-auth`` (Kubernetes TokenReview),
    and what closes it."""
    if srv.metrics_auth_token_file and srv.metrics_endpoint_auth:
        raise errors.ConfigError("give --metrics-auth-token-file or --metrics-endpoint-auth, not both")
    if srv.metrics_auth_token_file:
        token = metricsauth.StaticToken(srv.metrics_auth_token_file)

        async def static_verdict(authorization: str | None) -> metricsauth.Verdict:
            return token.verdict(authorization)

        return static_verdict, None
    if srv.metrics_endpoint_auth:
        from picker.discovery import tokenreview  # imports kubernetes-asyncio

        reviewer = tokenreview.Reviewer(kube or kubesettings.KubeSettings())
        return reviewer.verdict, reviewer.close
    return None, None


async def start_metrics(
    host: str,
    port: int,
    authorize: MetricsAuthorizer | None = None,
    close: Callable[[], Awaitable[None]] | None = None,
    *,
    pprof_routes: bool = False,
    render: Callable[[], Awaitable[bytes]] | None = None,
) -> web.AppRunner | None:
    """``GET /metrics`` (picker's registry). Exposition runs in a thread so a scrape never stalls streams.
    ``render``: the page to serve instead (the ``--workers`` supervisor's merge of its workers' pages).

    With ``authorize`` every request must pass it: 401 (with ``WWW-Authenticate: Bearer``) or 403 otherwise.
    ``pprof_routes``: also ``/debug/pprof/`` (``--enable-pprof``, telemetry/pprof.py), behind the same check."""
    if not port:
        return None

    async def own_page() -> bytes:
        return await asyncio.get_running_loop().run_in_executor(None, generate_latest, REGISTRY)

    page = render or own_page

    async def metrics(_: web.Request) -> web.Response:
        body = await page()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    middlewares = []
    if authorize is not None:
        check = authorize

        @web.middleware
        async def authorized(request: web.Request, handler: _Handler) -> web.StreamResponse:
            verdict = await check(request.headers.get("Authorization"))
            if verdict is metricsauth.Verdict.UNAUTHENTICATED:
                return web.Response(status=401, text="Unauthorized\n", headers={"WWW-Authenticate": "Bearer"})
            if verdict is not metricsauth.Verdict.ALLOWED:
                return web.Response(status=403, text="Forbidden\n")
            return await handler(request)

        middlewares.append(authorized)
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/metrics", metrics)
    if pprof_routes:
        pprof.add_routes(app)
    if close is not None:

        async def on_cleanup(_: web.Application) -> None:
            await close()

        app.on_cleanup.append(on_cleanup)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise errors.ConfigError(f"cannot listen on {host}:{port} (--metrics-port): {exc.strerror or exc}") from exc
    return runner
