"""--metrics-endpoint-auth against the stand-in API server: TokenReview, then SubjectAccessReview, cached."""

from __future__ import annotations

from picker.discovery import rbac
from picker.discovery.kubesettings import KubeSettings
from picker.discovery.tokenreview import Reviewer
from picker.telemetry.metricsauth import Verdict
from tests.kube.apiserver import FakeApiServer

PROMETHEUS = {
    "username": "system:serviceaccount:monitoring:prometheus",
    "uid": "u1",
    "groups": ["system:authenticated"],
}
INTRUDER = {"username": "system:serviceaccount:default:intruder", "groups": ["system:authenticated"]}


async def test_token_review_then_access_review_with_caching() -> None:
    async with FakeApiServer() as api:
        api.tokens = {"prom-token": PROMETHEUS, "other-token": INTRUDER}
        api.non_resource_grants = {(PROMETHEUS["username"], "get", "/metrics")}
        now = [0.0]
        reviewer = Reviewer(KubeSettings(api_server=api.url), clock=lambda: now[0])
        try:
            assert await reviewer.verdict("Bearer prom-token") is Verdict.ALLOWED
            assert await reviewer.verdict("Bearer other-token") is Verdict.FORBIDDEN
            assert await reviewer.verdict("Bearer forged") is Verdict.UNAUTHENTICATED
            assert await reviewer.verdict(None) is Verdict.UNAUTHENTICATED
            calls = len(api.requests)
            assert calls == 5  # 2 reviews each for the two known tokens, 1 for the forged one, none without one

            assert await reviewer.verdict("Bearer prom-token") is Verdict.ALLOWED  # cached
            assert len(api.requests) == calls
            now[0] = 61.0  # allowed answers live 60 s
            api.non_resource_grants.clear()
            assert await reviewer.verdict("Bearer prom-token") is Verdict.FORBIDDEN
            api.non_resource_grants = {("group:system:authenticated", "get", "/metrics")}  # a group grant
            now[0] = 72.0  # refusals live 10 s
            assert await reviewer.verdict("Bearer other-token") is Verdict.ALLOWED

            # Every call the reviewer made is covered by the rules the chart's ClusterRole grants.
            granted = {(r.resource + "." + r.api_group, v) for r in rbac.METRICS_AUTH_RULES for v in r.verbs}
            assert {(res, verb) for verb, res, _ in api.requests} <= granted
            assert all("prom-token" not in str(q) for _, _, q in api.requests)  # the token is in bodies only
        finally:
            await reviewer.close()


async def test_an_unreachable_api_refuses_and_does_not_cache() -> None:
    async with FakeApiServer() as api:
        api.tokens = {"prom-token": PROMETHEUS}
        api.non_resource_grants = {(PROMETHEUS["username"], "get", "/metrics")}
        url = api.url
    reviewer = Reviewer(KubeSettings(api_server=url))  # the server is gone
    try:
        assert await reviewer.verdict("Bearer prom-token") is Verdict.UNAUTHENTICATED
    finally:
        await reviewer.close()


async def test_the_cache_is_bounded() -> None:
    async with FakeApiServer() as api:
        reviewer = Reviewer(KubeSettings(api_server=api.url), max_cached=3)
        try:
            for i in range(10):
                assert await reviewer.verdict(f"Bearer random-{i}") is Verdict.UNAUTHENTICATED
            assert len(reviewer._cache) == 3
        finally:
            await reviewer.close()
