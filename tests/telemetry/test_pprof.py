"""``/debug/pprof/heap``: tracemalloc's allocation sites, the biggest first."""

from __future__ import annotations

import tracemalloc

from picker.telemetry.pprof import heap_sites


def test_heap_sites_name_the_line_that_holds_the_memory() -> None:
    tracemalloc.start()
    try:
        held = [bytes(1000) + bytes([i % 256]) for i in range(20_000)]  # ~20 MB on this line
        text = heap_sites(5)
    finally:
        tracemalloc.stop()
    lines = text.splitlines()
    assert lines[0].startswith("traced: ")
    size, count, site = lines[1].split(" ", 2)
    assert site.endswith("test_pprof.py:13")
    assert int(size) >= 20_000_000
    assert int(count) >= 20_000
    assert len(lines) <= 6  # the total and at most 5 sites
    del held
