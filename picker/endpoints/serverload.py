"""What a model server is working on now: its last report, corrected by what picker sent it since.

A scrape says what the server had (waiting and running requests, KV-cache use) when its page was read, up to a
scrape interval ago. picker's ledger (``InflightTracker``) knows exactly what *this* picker has sent and not
seen finish, but nothing of other traffic: other picker replicas or gateways, clients that call the server
directly, requests still running from before a restart. Neither decides alone:

    foreign_e  = max(0, waiting_e + running_e - own_at_sample_e)    what the server had that picker did not send
    requests_e = own_now_e + foreign_e

``own_at_sample_e`` is picker's own in-flight count on e when the page was read (``EndpointMetrics.own_requests``,
noted by the poller), so requests picker sent, or saw finish, since the sample are counted once, from the
ledger. When picker is the only client the foreign part is zero and the estimate is the ledger, which moves at
every pick (a burst does not herd onto the server a stale scrape calls idle); when someone else loads a server,
the next scrape shows it. A sample older than ``max_age_s`` (or none) counts no foreign load: the ledger alone.

Other routers read the same reports. Between two scrapes each sees only its own sends, though the others, reading
the same report, are likely to favour the same servers. So the foreign part is assumed to have moved as picker's
own count there did since the sample, scaled to the share of that server's traffic picker sends ("the others do
as I do"):

    m_e        = (waiting_e + running_e) / own_at_sample_e                      in [1, 8]; 1 when own_at_sample_e is 0
    foreign'_e = max(0, foreign_e + (m_e - 1) * (own_now_e - own_at_sample_e))

the added requests waiting, the removed ones taken from waiting and running alike. When picker sends all of a
server's traffic m_e is 1 and nothing changes; with peers exchanging their ledgers (docs/ha.md) own is the pool's
and m_e is about 1 too. Per server, not over the pool: a client that sends half the pool's traffic to one server
does not follow picker, and there picker's share (and its own change) is small, so its own moves elsewhere are not
read as the client's (one m over the pool would count such a client's traffic as following picker's sends to the
other servers: tests/bench/test_lab_scenarios.py). ``waiting_of``, the waiting requests alone, is not moved
(``follow_own`` off; its docstring).

In tokens (the unit of ``token-load-scorer``): the ledger's own tokens, plus each foreign request at the weight
of an average request picker routed: a waiting one as a whole request (prompt + answer), a running one as an
answer. The foreign requests are split between waiting and running in the proportion the server reported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from picker.endpoints.inflight import EndpointLoad
from picker.endpoints.model import Endpoint

__all__ = [
    "DEFAULT_MAX_AGE_S",
    "MAX_OTHERS_PER_OWN",
    "ServerLoad",
    "estimate",
    "foreign_of",
    "requests_of",
    "tokens_of",
    "waiting_of",
]

DEFAULT_MAX_AGE_S = 2.0  # as --metrics-staleness-threshold: older samples are not the server's present
# The most of a server's traffic counted per request of picker's own there: beyond, picker sends too little of it
# (just restarted, or a small share beside other clients) for its own sends to say where the rest go.
MAX_OTHERS_PER_OWN = 8.0


@dataclass(slots=True)  # not frozen: one is built per candidate per decision, and a frozen one costs 4x to build
class ServerLoad:
    """One endpoint's estimated load now (see the module docstring; read only once made)."""

    own_requests: int  # picker's in flight there now
    own_tokens: int  # picker's prompt tokens not yet prefilled + expected output tokens there now
    foreign_waiting: float  # requests the server reported beyond picker's own, waiting for a slot
    foreign_running: float  # ... and running
    kv_usage: float  # the server's reported KV-cache use (0 without a fresh sample)
    fresh: bool  # a sample no older than max_age_s was used

    @property
    def foreign_requests(self) -> float:
        return self.foreign_waiting + self.foreign_running

    @property
    def requests(self) -> float:
        return self.own_requests + self.foreign_requests

    def tokens(self, request_tokens: float, decode_tokens: float) -> float:
        """Own tokens plus foreign requests weighted as average ones: waiting at ``request_tokens`` (prompt +
        answer), running at ``decode_tokens`` (the answer)."""
        return self.own_tokens + self.foreign_waiting * request_tokens + self.foreign_running * decode_tokens


def estimate(
    endpoint: Endpoint, own: EndpointLoad, now: float, max_age_s: float = DEFAULT_MAX_AGE_S, follow_own: bool = True
) -> ServerLoad:
    """``endpoint``'s load now from its last scrape and picker's ledger ``own`` (``InflightTracker.load``); with
    ``follow_own`` the foreign part moved with picker's own count since the sample (the module docstring)."""
    m = endpoint.metrics
    if m.updated_at <= 0.0 or now - m.updated_at > max_age_s:
        return ServerLoad(own.requests, own.tokens, 0.0, 0.0, 0.0, fresh=False)
    reported = m.waiting + m.running
    own_then = m.own_requests if m.own_requests is not None else own.requests
    foreign, waiting = _moved(reported, m.waiting, own_then, own.requests if follow_own else own_then)
    if foreign <= 0:
        return ServerLoad(own.requests, own.tokens, 0.0, 0.0, m.kv_usage, fresh=True)
    return ServerLoad(own.requests, own.tokens, waiting, foreign - waiting, m.kv_usage, fresh=True)


def _moved(reported: int, waiting: int, own_then: int, own_now: int) -> tuple[float, float]:
    """(the foreign requests, the waiting ones among them) now, (0, 0) for none: what the server reported beyond
    picker's own at the sample, split as reported, moved m - 1 times picker's own change since."""
    foreign = reported - own_then
    if foreign <= 0:
        return 0.0, 0.0
    share = foreign * waiting / reported
    if own_then <= 0 or own_now == own_then:
        return foreign, share
    ratio = reported / own_then
    change = ((ratio if ratio < MAX_OTHERS_PER_OWN else MAX_OTHERS_PER_OWN) - 1.0) * (own_now - own_then)
    if change >= 0.0:
        return foreign + change, share + change
    left = foreign + change
    if left <= 0.0:
        return 0.0, 0.0
    return left, share * left / foreign


# The scorers' per-endpoint loops: ``estimate(e, ...).requests`` / ``.tokens(...)`` / ``.foreign_waiting`` for each
# endpoint in order, without a ServerLoad per endpoint (that allocation was the largest per-endpoint cost of a
# cycle). Each computes the same float expressions as ``estimate`` and ``ServerLoad``, so the results are
# identical (tests/endpoints/test_serverload.py checks it on randomized pools).


def _foreign(
    endpoints: Sequence[Endpoint],
    load: Callable[[str], EndpointLoad],
    now: float,
    max_age_s: float,
    follow_own: bool = True,
) -> Iterator[tuple[EndpointLoad, float, float]]:
    """(picker's own load, the foreign requests, the foreign waiting ones) for each endpoint, as ``estimate``
    counts them: zeros without a fresh sample or foreign requests."""
    for e in endpoints:
        own = load(e.key)
        m = e.metrics
        updated = m.updated_at
        if updated <= 0.0 or now - updated > max_age_s:
            yield own, 0.0, 0.0
            continue
        reported = m.waiting + m.running
        own_then = m.own_requests if m.own_requests is not None else own.requests
        foreign, waiting = _moved(reported, m.waiting, own_then, own.requests if follow_own else own_then)
        if foreign <= 0:
            yield own, 0.0, 0.0
            continue
        yield own, foreign, waiting


def requests_of(
    endpoints: Sequence[Endpoint], load: Callable[[str], EndpointLoad], now: float, max_age_s: float = DEFAULT_MAX_AGE_S
) -> list[float]:
    """``estimate(e, load(e.key), now, max_age_s).requests`` for each endpoint, in order."""
    return [
        own.requests + (waiting + (foreign - waiting))
        for own, foreign, waiting in _foreign(endpoints, load, now, max_age_s)
    ]


def tokens_of(
    endpoints: Sequence[Endpoint],
    load: Callable[[str], EndpointLoad],
    now: float,
    request_tokens: float,
    decode_tokens: float,
    max_age_s: float = DEFAULT_MAX_AGE_S,
) -> list[float]:
    """``estimate(e, load(e.key), now, max_age_s).tokens(request_tokens, decode_tokens)`` for each endpoint."""
    return [
        own.tokens + waiting * request_tokens + (foreign - waiting) * decode_tokens
        for own, foreign, waiting in _foreign(endpoints, load, now, max_age_s)
    ]


def waiting_of(
    endpoints: Sequence[Endpoint], load: Callable[[str], EndpointLoad], now: float, max_age_s: float = DEFAULT_MAX_AGE_S
) -> list[float]:
    """``estimate(e, load(e.key), now, max_age_s, follow_own=False).foreign_waiting`` for each endpoint, in order:
    the waiting requests each server reported beyond picker's own at its sample, not moved with picker's sends since.
    Its reader (``token-load-scorer``'s short prompts) spaces requests by a rotation, which the other routers'
    rotations do not follow: a server picker just sent a short prompt to is no likelier to have had the others'."""
    return [waiting for _, _, waiting in _foreign(endpoints, load, now, max_age_s, follow_own=False)]


def foreign_of(
    endpoints: Sequence[Endpoint], load: Callable[[str], EndpointLoad], now: float, max_age_s: float = DEFAULT_MAX_AGE_S
) -> list[float]:
    """``estimate(e, load(e.key), now, max_age_s).foreign_requests`` for each endpoint, in order."""
    return [waiting + (foreign - waiting) for _, foreign, waiting in _foreign(endpoints, load, now, max_age_s)]
