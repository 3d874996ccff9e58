"""Which servers a worker polls among a pod's workers, and when it polls another's."""

from __future__ import annotations

import pytest

from picker.endpoints.model import EndpointMetrics
from picker.scrape.share import ScrapeShare, SharedScrape

KEYS = [f"10.{i // 250}.{i % 250}.1:8000" for i in range(600)]


def test_every_server_has_exactly_one_owner_and_the_shares_are_even() -> None:
    shares = [ScrapeShare(i, 3, takeover_s=1.0) for i in range(3)]
    owners = [[s.index for s in shares if s.owns(k)] for k in KEYS]
    assert all(len(o) == 1 for o in owners)
    counts = [sum(1 for o in owners if o == [i]) for i in range(3)]
    assert all(150 <= c <= 250 for c in counts), counts
    # the same for a worker restarted with the same index (a new process): ownership depends on the key alone
    again = ScrapeShare(1, 3, takeover_s=1.0)
    assert [again.owns(k) for k in KEYS] == [shares[1].owns(k) for k in KEYS]


def test_a_server_nobody_reports_on_is_polled_here_until_its_owner_speaks() -> None:
    share = ScrapeShare(0, 2, takeover_s=1.0)
    other = next(k for k in KEYS if not share.owns(k))
    mine = next(k for k in KEYS if share.owns(k))
    assert share.due(mine, 0.0)
    assert share.due(other, 0.0)  # never heard of: polled here (at start the links may not be up yet)
    share.receive([SharedScrape(other, 0.0, EndpointMetrics(waiting=1))], 0.5)
    assert not share.due(other, 0.6)  # its owner speaks
    assert not share.due(other, 1.4)
    assert share.due(other, 1.5)  # silent for takeover_s: polled here again
    share.receive([SharedScrape(other, 0.0, EndpointMetrics())], 2.0)
    assert not share.due(other, 2.1)  # the owner is back
    share.forget(other)  # it left the pool; if it comes back, it is polled here until its owner speaks
    assert share.due(other, 2.2)
    assert share.due(mine, 2.2)


def test_received_outcomes_go_to_the_subscriber_as_they_arrive() -> None:
    share = ScrapeShare(0, 2, takeover_s=1.0)
    a, b = [k for k in KEYS if not share.owns(k)][:2]
    first, second = SharedScrape(a, 0.0, None, "timeout", "t"), SharedScrape(b, 0.1, EndpointMetrics())
    share.receive([first], 0.0)  # nobody listens yet: only the silence clock is reset
    got: list[list[SharedScrape]] = []
    share.subscribe(lambda scrapes: got.append(list(scrapes)))
    share.receive([first, second], 0.5)
    assert got == [[first, second]]
    assert not share.due(a, 1.4)  # heard at 0.5
    assert share.due(a, 1.5)


@pytest.mark.parametrize(
    ("index", "count", "takeover_s", "error"),
    [(2, 2, 1.0, "worker 2 of 2"), (-1, 2, 1.0, "worker -1 of 2"), (0, 2, 0.0, "takeover_s must be positive")],
)
def test_bad_shares_are_refused(index: int, count: int, takeover_s: float, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ScrapeShare(index, count, takeover_s=takeover_s)


def test_the_memory_of_what_was_heard_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("picker.scrape.share._MAX_HEARD", 3)
    share = ScrapeShare(0, 2, takeover_s=1.0)
    others = [k for k in KEYS if not share.owns(k)][:5]
    share.receive([SharedScrape(k, 0.0, EndpointMetrics()) for k in others], 0.0)
    # the oldest two are forgotten: polled here (until heard of again), the newest three are not
    assert [share.due(k, 0.1) for k in others] == [True, True, False, False, False]
