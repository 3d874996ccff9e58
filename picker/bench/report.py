"""Load-run reports: summary numbers (percentiles, throughput, Little's law), JSON, a console table, a PNG.

Little's law check: over the run's window T (first request start to last request end), the mean number of
requests in flight L should equal throughput x mean latency, ``L = (N / T) x W``. ``L`` is measured
independently by sampling the in-flight count during the run (and, for a closed loop, is also the configured
concurrency), so a large mismatch means lost requests, clock trouble or a broken sampler.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picker.bench.load import LoadResult, RequestRecord

__all__ = ["Dist", "Summary", "percentile", "plot", "print_summary", "summarize", "to_json"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of an ascending, non-empty sequence."""
    if not sorted_values:
        raise ValueError("percentile of an empty sequence")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Dist:
    count: int = 0
    mean: float = 0.0
    min: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p95: float = 0.0
    p99: float = 0.0
    max: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        if not values:
            return cls()
        v = sorted(values)
        return cls(
            count=len(v),
            mean=sum(v) / len(v),
            min=v[0],
            p50=percentile(v, 50),
            p90=percentile(v, 90),
            p95=percentile(v, 95),
            p99=percentile(v, 99),
            max=v[-1],
        )


@dataclass(frozen=True, slots=True)
class Summary:
    workload: str
    url: str
    model: str
    mode: str  # "rate 5/s" | "concurrency 8"
    requests: int
    ok: int
    failed: int
    errors: dict[str, int]
    duration_s: float
    throughput_rps: float  # successful requests per second
    output_tok_s: float
    input_tok_s: float
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    ttft_s: Dist
    tpot_s: Dist
    e2e_s: Dist
    max_itl_s: Dist
    mean_inflight: float  # sampled during the window
    target_concurrency: int | None
    littles_inflight: float  # (finished / T) x mean latency
    littles_ratio: float | None  # littles_inflight / mean_inflight
    backends: dict[str, int]
    tags: dict[str, Dist]  # TTFT per tag (at most 20 tags)

    @property
    def cached_share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def _error_key(rec: RequestRecord) -> str:
    if rec.status and rec.status != 200:
        return f"HTTP {rec.status}"
    return (rec.error or "error").split(":", 1)[0]


def summarize(result: LoadResult) -> Summary:
    recs = result.records
    ok = [r for r in recs if r.ok]
    spec = result.spec
    start = min((r.start_s for r in recs), default=0.0)
    end = max((r.end_s for r in recs), default=0.0)
    window = max(end - start, 1e-9)
    in_window = [n for t, n in result.inflight_samples if start <= t <= end]
    mean_inflight = sum(in_window) / len(in_window) if in_window else 0.0
    littles = (len(recs) / window) * (sum(r.e2e_s for r in recs) / len(recs)) if recs else 0.0
    tags = Counter(r.tag for r in ok)
    return Summary(
        workload=result.workload,
        url=result.url,
        model=result.model,
        mode=f"rate {spec.rate:g}/s" if spec.rate is not None else f"concurrency {spec.concurrency}",
        requests=len(recs),
        ok=len(ok),
        failed=len(recs) - len(ok),
        errors=dict(Counter(_error_key(r) for r in recs if not r.ok)),
        duration_s=window,
        throughput_rps=len(ok) / window,
        output_tok_s=sum(r.output_tokens for r in ok) / window,
        input_tok_s=sum(r.prompt_tokens or 0 for r in ok) / window,
        output_tokens=sum(r.output_tokens for r in ok),
        prompt_tokens=sum(r.prompt_tokens or 0 for r in ok),
        cached_tokens=sum(r.cached_tokens or 0 for r in ok),
        ttft_s=Dist.of([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=Dist.of([t for r in ok if (t := r.tpot_s) is not None]),
        e2e_s=Dist.of([r.e2e_s for r in ok]),
        max_itl_s=Dist.of([r.max_itl_s for r in ok if r.output_tokens > 1]),
        mean_inflight=mean_inflight,
        target_concurrency=spec.concurrency,
        littles_inflight=littles,
        littles_ratio=littles / mean_inflight if mean_inflight > 0 else None,
        backends=dict(Counter(r.backend or "?" for r in ok)),
        tags=(
            {t: Dist.of([r.ttft_s for r in ok if r.tag == t and r.ttft_s is not None]) for t in sorted(tags)}
            if len(tags) <= 20
            else {}
        ),
    )


def to_json(result: LoadResult, summary: Summary, *, records: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "summary": {**dataclasses.asdict(summary), "cached_share": summary.cached_share},
        "spec": dataclasses.asdict(result.spec),
    }
    if records:
        out["records"] = [dataclasses.asdict(r) for r in result.records]
    return out


def print_summary(summary: Summary) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    s = summary
    console.print(
        f"[bold]{s.workload}[/] at {s.url} ({s.model}), {s.mode}: {s.ok}/{s.requests} ok in {s.duration_s:.2f} s"
        + (f", errors {s.errors}" if s.errors else "")
    )
    table = Table("metric", "mean", "p50", "p90", "p99", "max")
    for name, d, scale in (("TTFT ms", s.ttft_s, 1e3), ("TPOT ms", s.tpot_s, 1e3), ("e2e s", s.e2e_s, 1.0)):
        table.add_row(
            name, *(f"{v * scale:.1f}" if scale > 1 else f"{v:.3f}" for v in (d.mean, d.p50, d.p90, d.p99, d.max))
        )
    console.print(table)
    ratio = f"{s.littles_ratio:.2f}" if s.littles_ratio is not None else "n/a"
    target = f" (configured {s.target_concurrency})" if s.target_concurrency else ""
    console.print(
        f"throughput {s.throughput_rps:.2f} req/s, {s.output_tok_s:.0f} output tok/s, {s.input_tok_s:.0f} input tok/s;"
        f" cached prompt share {s.cached_share:.0%}\n"
        f"Little's law: in flight measured {s.mean_inflight:.2f}{target}, throughput x latency "
        f"{s.littles_inflight:.2f} (ratio {ratio})"
    )
    if len(s.backends) > 1:
        console.print("backends: " + ", ".join(f"{b} {n}" for b, n in sorted(s.backends.items())))


def plot(results: Sequence[LoadResult], path: str | Path) -> None:
    """TTFT and TPOT distributions, TTFT over the run, and latency vs load (one point per result) as a PNG."""
    from matplotlib.figure import Figure  # no pyplot: no global state, Agg canvas on savefig

    fig = Figure(figsize=(12, 8), layout="constrained")
    ax_ttft, ax_tpot, ax_time, ax_load = fig.subplots(2, 2).flat
    for res in results:
        ok = [r for r in res.records if r.ok]
        label = f"{res.workload} {summarize(res).mode}"
        ttfts = [r.ttft_s * 1e3 for r in ok if r.ttft_s is not None]
        tpots = [t * 1e3 for r in ok if (t := r.tpot_s) is not None]
        if ttfts:
            ax_ttft.hist(ttfts, bins=40, alpha=0.6, label=label)
        if tpots:
            ax_tpot.hist(tpots, bins=40, alpha=0.6, label=label)
        ax_time.scatter([r.start_s for r in ok if r.ttft_s is not None], ttfts, s=6, label=label)
    ax_ttft.set(title="TTFT", xlabel="ms", ylabel="requests")
    ax_tpot.set(title="TPOT", xlabel="ms", ylabel="requests")
    ax_time.set(title="TTFT over the run", xlabel="request start (s)", ylabel="TTFT (ms)")
    summaries = [summarize(r) for r in results]
    xs = [s.throughput_rps for s in summaries]
    curves: dict[str, list[float]] = {
        "TTFT p50": [s.ttft_s.p50 for s in summaries],
        "TTFT p90": [s.ttft_s.p90 for s in summaries],
        "e2e p50": [s.e2e_s.p50 for s in summaries],
        "e2e p90": [s.e2e_s.p90 for s in summaries],
    }
    for name, ys in curves.items():
        ax_load.plot(xs, [y * 1e3 for y in ys], marker="o", label=name)
    ax_load.set(title="latency vs load", xlabel="throughput (req/s)", ylabel="ms", yscale="log")
    for ax in (ax_ttft, ax_tpot, ax_time, ax_load):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.savefig(str(path), dpi=100)
