"""FlowQueue: strict priority, fairness between flows, ordering in a flow, capacity, removal, expiry."""

from __future__ import annotations

import itertools

from picker.admission.flowconfig import BandConfig, FlowConfig
from picker.admission.queue import FlowQueue, QueuedRequest
from tests.admission.helpers import req

_seq = itertools.count()


def item(flow: str = "a", priority: int = 0, size: int = 10, deadline: float | None = None) -> QueuedRequest:
    n = next(_seq)
    return QueuedRequest(req(flow, priority), priority, flow, size, float(n), deadline, n)


def drain(queue: FlowQueue) -> list[QueuedRequest]:
    out = []
    while (x := queue.pop()) is not None:
        out.append(x)
    return out


def test_strict_priority_between_bands() -> None:
    queue = FlowQueue(FlowConfig())
    low, mid, high = item(priority=-1), item(priority=0), item(priority=5)
    for x in (low, mid, high):
        queue.push(x)
    assert (len(queue), queue.bytes) == (3, 30)
    assert drain(queue) == [high, mid, low]
    assert (len(queue), queue.bytes) == (0, 0)


def test_global_strict_is_one_fifo_across_flows() -> None:
    queue = FlowQueue(FlowConfig())
    items = [item("flood") for _ in range(3)] + [item("quiet")]
    for x in items:
        queue.push(x)
    assert [x.flow for x in drain(queue)] == ["flood", "flood", "flood", "quiet"]


def test_round_robin_takes_turns() -> None:
    queue = FlowQueue(FlowConfig(default_band=BandConfig(fairness="round-robin-fairness-policy")))
    for x in [item("flood") for _ in range(4)] + [item("quiet"), item("quiet"), item("third")]:
        queue.push(x)
    assert [x.flow for x in drain(queue)] == ["flood", "quiet", "third", "flood", "quiet", "flood", "flood"]


def test_a_flow_that_empties_rejoins_at_the_end() -> None:
    queue = FlowQueue(FlowConfig(default_band=BandConfig(fairness="round-robin-fairness-policy")))
    queue.push(item("a"))
    queue.push(item("b"))
    queue.push(item("b"))
    assert queue.pop().flow == "a"  # type: ignore[union-attr]
    queue.push(item("a"))  # a rejoins behind b
    assert [x.flow for x in drain(queue)] == ["b", "a", "b"]


def test_edf_orders_by_deadline_then_arrival() -> None:
    queue = FlowQueue(FlowConfig(default_band=BandConfig(ordering="edf-ordering-policy")))
    late, none, soon, none2 = item(deadline=50.0), item(), item(deadline=10.0), item()
    for x in (late, none, soon, none2):
        queue.push(x)
    assert drain(queue) == [soon, late, none, none2]


def test_slo_deadline_orders_by_arrival_plus_ttft_objective() -> None:
    import dataclasses

    from picker.admission.flow import _slo_deadline

    queue = FlowQueue(FlowConfig(default_band=BandConfig(ordering="slo-deadline-ordering-policy")))
    loose, none, tight, alias = item(), item(), item(), item()
    loose.req = dataclasses.replace(loose.req, headers={"x-llm-d-slo-ttft-ms": "5000"})
    tight.req = dataclasses.replace(tight.req, headers={"x-llm-d-slo-ttft-ms": "200"})
    alias.req = dataclasses.replace(alias.req, headers={"x-slo-ttft-ms": "1000"})
    for x in (loose, none, tight, alias):
        x.slo_deadline = _slo_deadline(x.req, x.enqueued_at)
        queue.push(x)
    assert drain(queue) == [tight, alias, loose, none]


def test_capacity_global_and_per_band() -> None:
    queue = FlowQueue(FlowConfig(max_requests=2, bands={1: BandConfig(max_bytes=15)}))
    assert queue.capacity_error(1, 10) is None
    queue.push(item(priority=1, size=10))
    assert queue.capacity_error(1, 10) is not None  # band bytes 20 > 15
    assert queue.capacity_error(0, 10) is None
    queue.push(item(priority=0))
    assert queue.capacity_error(0, 1) == "queue at capacity and displacement failed to make space"
    big = FlowQueue(FlowConfig(max_bytes=100))
    assert big.capacity_error(0, 101) is not None
    assert FlowQueue(FlowConfig()).capacity_error(0, 2_000_000_000) is not None  # the 1 GB band default


def test_remove_and_expired() -> None:
    queue = FlowQueue(FlowConfig())
    a, b, c = item(deadline=5.0), item(deadline=9.0), item()
    for x in (a, b, c):
        queue.push(x)
    assert queue.remove(b)
    assert not queue.remove(b)
    assert queue.expired(4.9) == []
    assert queue.expired(5.0) == [a]
    assert list(queue) == [c]
    assert drain(queue) == [c]
    assert not queue.remove(c)
