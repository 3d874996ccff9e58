"""Summaries from records: percentiles, throughput, Little's law, JSON, the PNG."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from picker.bench.load import LoadResult, LoadSpec, RequestRecord, merge_results
from picker.bench.report import Dist, percentile, plot, summarize, to_json


def test_percentile_interpolates() -> None:
    v = [1.0, 2.0, 3.0, 4.0]
    assert percentile(v, 0) == 1.0
    assert percentile(v, 100) == 4.0
    assert percentile(v, 50) == 2.5
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    d = Dist.of([3.0, 1.0, 2.0])
    assert (d.count, d.min, d.p50, d.max, d.mean) == (3, 1.0, 2.0, 3.0, 2.0)
    assert Dist.of([]) == Dist()


def synthetic(concurrency: int = 2, n: int = 10) -> LoadResult:
    """``concurrency`` back-to-back lanes of 1-second requests with 100 ms TTFT and 11 tokens."""
    spec = LoadSpec(concurrency=concurrency, max_requests=n)
    recs = []
    for i in range(n):
        lane, k = i % concurrency, i // concurrency
        recs.append(
            RequestRecord(
                i, "t", "m", start_s=float(k), e2e_s=1.0, ttft_s=0.1, output_tokens=11, chunks=11,
                prompt_tokens=100, cached_tokens=25, status=200, backend=f"b{lane}",
            )
        )  # fmt: skip
    recs.append(RequestRecord(n, "t", "m", start_s=0.0, e2e_s=0.5, status=503, error="Service Unavailable"))
    samples = [(t / 10, concurrency + (1 if t < 5 else 0)) for t in range(0, 50)]
    return LoadResult("http://x", "w", spec, "m", recs, duration_s=5.0, inflight_samples=samples)


def test_summary_numbers() -> None:
    s = summarize(synthetic())
    assert (s.requests, s.ok, s.failed) == (11, 10, 1)
    assert s.errors == {"HTTP 503": 1}
    assert s.duration_s == pytest.approx(5.0)
    assert s.throughput_rps == pytest.approx(2.0)
    assert s.output_tok_s == pytest.approx(22.0)
    assert s.ttft_s.p50 == pytest.approx(0.1)
    assert s.tpot_s.p50 == pytest.approx(0.09)  # (1.0 - 0.1) / 10
    assert s.cached_share == pytest.approx(0.25)
    assert s.backends == {"b0": 5, "b1": 5}
    # In flight: 10 s of requests + 0.5 s of the failed one over 5 s = 2.1; sampled mean 2.1.
    assert s.littles_inflight == pytest.approx(2.1)
    assert s.mean_inflight == pytest.approx(2.1)
    assert s.littles_ratio == pytest.approx(1.0)
    assert s.mode == "concurrency 2"


def test_empty_result_summarizes() -> None:
    s = summarize(LoadResult("u", "w", LoadSpec(rate=1), "m"))
    assert (s.requests, s.ok, s.throughput_rps, s.littles_ratio) == (0, 0, 0.0, None)


def test_json_and_plot(tmp_path: Path) -> None:
    res = synthetic()
    doc = orjson.loads(orjson.dumps(to_json(res, summarize(res))))
    assert doc["summary"]["ok"] == 10
    assert len(doc["records"]) == 11
    assert doc["spec"]["concurrency"] == 2
    out = tmp_path / "p.png"
    plot([res, synthetic(3, 12)], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_merge_aligns_runs_and_sums() -> None:
    a, b = synthetic(2, 10), synthetic(3, 12)
    a.t0, b.t0 = 100.0, 100.5
    merged = merge_results([a, b])
    assert len(merged.records) == 24  # 10 + 12 + one failed request each
    assert [r.index for r in merged.records] == list(range(24))
    assert min(r.start_s for r in merged.records if r.backend == "b2") == pytest.approx(0.5)  # b's lanes shifted
    assert merged.spec.concurrency == 4  # per-URL concurrency x 2 URLs (a's spec)
    assert merged.t0 == 100.0
    assert max(n for _, n in merged.inflight_samples) == 2 + (3 + 1)  # b starts (4 in flight) 0.5 s after a
    assert merge_results([a]) is a
    with pytest.raises(ValueError, match="nothing"):
        merge_results([])
