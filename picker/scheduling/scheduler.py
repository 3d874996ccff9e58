"""The scheduler: the profile-handler loop over a configuration's profiles, and the plugin hooks around it.

``schedule`` asks the profile handler which profiles to run, runs them (filters → weighted scorers → picker),
repeats until the handler names none, and returns the primary profile's targets with the explanation and each
plugin's duration. ``pre_request`` / ``post_response`` fan out to the plugins implementing those hooks;
``on_snapshot`` tells plugins with per-endpoint state which endpoints left the pool. A user plugin's hooks run
under a guard of their own (``isolation``): a failure is counted and logged once per failing streak.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import cast

import orjson

from picker import errors
from picker.endpoints.model import Endpoint, EndpointSnapshot
from picker.request import headers as hdr
from picker.request.model import InferenceRequest
from picker.scheduling.config import SchedulerConfig
from picker.scheduling.framework import (
    CycleState,
    EndpointsChanged,
    FirstToken,
    PluginContext,
    PluginTiming,
    PostResponse,
    PreRequest,
    ProfileResult,
    ProfileRun,
    RequestHeaders,
    ResponseHeaders,
    ResponseInfo,
    SchedulingResult,
)
from picker.scheduling.isolation import Dropped, Guard, GuardedPlugin
from picker.scheduling.prefilter import Prefilter, PrefixHolders

__all__ = ["NO_CANDIDATES", "Scheduler"]

log = logging.getLogger(__name__)

NO_CANDIDATES = "failed to find endpoint candidates for serving the request"
PROFILE_PICKER, PROCESS_RESULTS = "ProfilePicker", "ProcessProfilesResults"
PRE_REQUEST, RESPONSE_COMPLETE = "PreRequest", "ResponseComplete"
# The reference calls ResponseStreaming on every chunk; picker calls FirstToken once, on the first output token.
FIRST_TOKEN = "FirstToken"
RESPONSE_HEADERS = "ResponseHeaders"
REQUEST_HEADERS = "PreRequest"  # the reference sets request headers in PreRequest plugins: timed as such
# Request headers a plugin may not set: picker's routing decision and the gateway's own (a plugin that set the
# destination header would bypass picker's lease accounting); llm-d's sidecar headers are what plugins are for.
_PICKER_OWNED = (hdr.SYSTEM_OWNED - {hdr.PREFILLER, hdr.ENCODERS, hdr.DATA_PARALLEL}) | {"host"}
# A handler that keeps naming new profiles is a bug; stop rather than loop forever.
_MAX_ROUNDS = 16
ENDPOINTS_CHANGED = "EndpointsChanged"  # for log messages only: the reference times no such point


@dataclass(frozen=True, slots=True)
class _Hook:
    """One plugin's hook: the bound method, the labels of its timing, and a guard for a user plugin."""

    call: Callable[..., None]
    plugin_type: str
    plugin_name: str
    guard: Guard | None  # None: a built-in, trusted

    @property
    def label(self) -> str:
        return f"{self.plugin_name!r} ({self.plugin_type})"


def _hooks(plugins: Sequence[object], protocol: type, method: str, point: str) -> tuple[_Hook, ...]:
    """The plugins implementing a hook protocol (for a user plugin: its own instance, under a hook guard)."""
    hooks: list[_Hook] = []
    for plugin in plugins:
        guarded = plugin if isinstance(plugin, GuardedPlugin) else None
        target = guarded.plugin if guarded is not None else plugin
        if not isinstance(target, protocol):
            continue
        call = getattr(target, method)
        if guarded is not None:
            hooks.append(_Hook(call, guarded.type, guarded.name, guarded.guard.hook_guard(point)))
        else:
            hooks.append(_Hook(call, *_type_name(plugin), None))
    return tuple(hooks)


class Scheduler:
    def __init__(self, config: SchedulerConfig, ctx: PluginContext, *, prefilter_k: int = 0) -> None:
        """``prefilter_k`` > 0: profiles score at most that many least loaded candidates plus the prefix holders
        (``scheduling.prefilter``); 0 scores every candidate."""
        self.config = config
        self._ctx = ctx
        self._handler = config.profile_handler
        self._profiles = config.profiles
        plugins = list(config.plugins.values())
        for profile in config.profiles.values():  # the implied default picker is in no plugins list
            if profile.picker not in plugins:
                plugins.append(profile.picker)
        if self._handler not in plugins:
            plugins.append(self._handler)
        self._pre_request = _hooks(plugins, PreRequest, "pre_request", PRE_REQUEST)
        self._first_token = _hooks(plugins, FirstToken, "first_token", FIRST_TOKEN)
        self._post_response = _hooks(plugins, PostResponse, "post_response", RESPONSE_COMPLETE)
        self._endpoint_watchers = _hooks(plugins, EndpointsChanged, "endpoints_changed", ENDPOINTS_CHANGED)
        self._response_headers = _hooks(plugins, ResponseHeaders, "response_headers", RESPONSE_HEADERS)
        self._request_headers = _hooks(plugins, RequestHeaders, "request_headers", REQUEST_HEADERS)
        self._known_keys: frozenset[str] | None = None
        holders = [p for p in plugins if not isinstance(p, GuardedPlugin) and isinstance(p, PrefixHolders)]
        self._prefilter = Prefilter(prefilter_k, ctx, holders) if prefilter_k > 0 else None

    def schedule(self, req: InferenceRequest, candidates: Sequence[Endpoint]) -> SchedulingResult:
        """Choose the destination of ``req`` among ``candidates`` (already subset-filtered).

        Raises ``errors.ServiceUnavailable`` when there are no candidates and ``errors.ResourceExhausted`` when
        the primary profile ends with no endpoint (filtered out).
        """
        started = perf_counter()
        if not candidates:
            raise errors.ServiceUnavailable(NO_CANDIDATES)
        handler = self._handler
        profiles = self._profiles
        cycle = CycleState()
        results: dict[str, ProfileResult | None] = {}
        runs: list[ProfileRun] = []
        timings: list[PluginTiming] = []
        failures: dict[str, str] = {}
        for _ in range(_MAX_ROUNDS):
            t0 = perf_counter()
            names = handler.pick_profiles(req, profiles, results, cycle)
            timings.append(PluginTiming(PROFILE_PICKER, handler.type, handler.name, perf_counter() - t0))
            todo = [n for n in names if n not in results]
            if not todo:
                break
            for name in todo:
                profile = profiles.get(name)
                if profile is None:
                    raise errors.Internal(f"profile handler {handler.name!r} picked unknown profile {name!r}")
                outcome = profile.run(req, candidates, cycle, timings, self._prefilter)
                runs.append(outcome.run)
                results[name] = outcome.run.result
                if outcome.failure is not None:
                    failures[name] = outcome.failure
        t0 = perf_counter()
        primary = handler.primary(results)
        timings.append(PluginTiming(PROCESS_RESULTS, handler.type, handler.name, perf_counter() - t0))
        chosen = results.get(primary)
        if chosen is None or not chosen.targets:
            why = failures.get(primary) or f"scheduling profile {primary!r} produced no result"
            log.debug("request %s: no target: %s", req.request_id, why)
            raise errors.ResourceExhausted(f"failed to find target endpoint: {why}")
        result = SchedulingResult(
            targets=chosen.targets,
            primary_profile=primary,
            runs=tuple(runs),
            profile_results=results,
            duration_s=perf_counter() - started,
            plugin_timings=tuple(timings),
            cycle=cycle,
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %s model %s -> %s explain=%s",
                req.request_id,
                req.target_model,
                ",".join(e.key for e in result.targets),
                orjson.dumps(result.explain()).decode(),
            )
        return result

    def pre_request(self, req: InferenceRequest, result: SchedulingResult) -> tuple[PluginTiming, ...]:
        """Tell PreRequest plugins the destination is chosen. A failing plugin is logged, not fatal."""
        return _fan_out(self._pre_request, PRE_REQUEST, req, result)

    def request_headers(self, req: InferenceRequest, result: SchedulingResult) -> dict[str, str]:
        """Headers RequestHeaders plugins want on the request routed upstream (e.g. ``x-prefiller-host-port``).

        Keys are lower-cased; a failing plugin contributes nothing; values must be strings; picker's own headers
        (the destination, content-length, the gateway's control headers) and pseudo-headers are never taken."""
        out: dict[str, str] = {}
        for hook in self._request_headers:
            call = cast(Callable[[InferenceRequest, SchedulingResult], object], hook.call)
            got: object
            if hook.guard is not None:
                got = hook.guard.call(call, req, result)
                if isinstance(got, Dropped):
                    continue
                hook.guard.ok()
            else:
                try:
                    got = call(req, result)
                except Exception:
                    log.exception("RequestHeaders plugin %s failed for request %s", hook.label, req.request_id)
                    continue
            if isinstance(got, Mapping):
                for k, v in got.items():
                    key = str(k).lower()
                    if isinstance(v, str) and key and not key.startswith(":") and key not in _PICKER_OWNED:
                        out[key] = v
        return out

    def first_token(self, req: InferenceRequest, info: ResponseInfo) -> tuple[PluginTiming, ...]:
        """Tell FirstToken plugins a streamed response's first token arrived. A failing plugin is logged."""
        return _fan_out(self._first_token, FIRST_TOKEN, req, info) if self._first_token else ()

    def post_response(self, req: InferenceRequest, info: ResponseInfo) -> tuple[PluginTiming, ...]:
        """Tell PostResponse plugins the response completed. A failing plugin is logged, not fatal."""
        return _fan_out(self._post_response, RESPONSE_COMPLETE, req, info)

    def response_headers(self, endpoint: Endpoint) -> dict[str, str]:
        """Headers ResponseHeaders plugins want on the response once ``endpoint`` serves it (usually none).

        A failing plugin contributes nothing; values must be strings."""
        out: dict[str, str] = {}
        for hook in self._response_headers:
            call = cast(Callable[[Endpoint], object], hook.call)
            got: object
            if hook.guard is not None:
                got = hook.guard.call(call, endpoint)
                if isinstance(got, Dropped):
                    continue
                hook.guard.ok()
            else:
                try:
                    got = call(endpoint)
                except Exception:
                    log.exception("ResponseHeaders plugin %s failed", hook.label)
                    continue
            if isinstance(got, Mapping):
                out.update((str(k).lower(), v) for k, v in got.items() if isinstance(v, str))
        return out

    def endpoints_changed(self, keys: frozenset[str]) -> None:
        """The pool is now ``keys``: plugins forget state of endpoints that left."""
        self._known_keys = keys
        for hook in self._endpoint_watchers:
            if hook.guard is not None:
                _guarded(hook.guard, hook.call, keys)
                continue
            try:
                hook.call(keys)
            except Exception:
                log.exception("plugin %s failed to drop departed endpoints", hook.label)

    def on_snapshot(self, snapshot: EndpointSnapshot) -> None:
        """An ``EndpointStore`` listener: acts only when membership changed (not on every metrics update)."""
        keys = frozenset(e.key for e in snapshot.endpoints)
        if keys != self._known_keys:
            self.endpoints_changed(keys)


def _type_name(plugin: object) -> tuple[str, str]:
    return str(getattr(plugin, "type", type(plugin).__name__)), str(getattr(plugin, "name", ""))


def _fan_out(hooks: Sequence[_Hook], point: str, req: InferenceRequest, arg: object) -> tuple[PluginTiming, ...]:
    """Call one request hook on every plugin that has it, timing each; a failure is logged or counted, not raised."""
    timings: list[PluginTiming] = []
    for hook in hooks:
        t0 = perf_counter()
        if hook.guard is not None:
            _guarded(hook.guard, hook.call, req, arg)
        else:
            try:
                hook.call(req, arg)
            except Exception:
                log.exception("%s plugin %s failed for request %s", point, hook.label, req.request_id)
        timings.append(PluginTiming(point, hook.plugin_type, hook.plugin_name, perf_counter() - t0))
    return tuple(timings)


def _guarded(guard: Guard, call: Callable[..., None], *args: object) -> None:
    if not isinstance(guard.call(call, *args), Dropped):
        guard.ok()
