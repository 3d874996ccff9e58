"""Side-by-side reports of load runs: one row per policy (lab) or per route (demo), a console table and a PNG.

A row is the load client's ``Summary`` plus how the requests spread over the servers: each server's share of
the successful requests and the imbalance, ``max share / mean share`` (1.0 = perfectly even; servers that got
nothing count when their names are given). For a mix of short and long answers (requests tagged ``short`` and
``long``: the ``seed-mix`` and ``short-long`` workloads) it also holds ``MixStats``: the short requests' TTFT, the
long answers' TPOT and every request's e2e, the numbers that tell whether short requests waited behind long ones.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picker.bench.load import LoadResult
from picker.bench.report import Dist, Summary, summarize, to_json

__all__ = ["MixStats", "Row", "by_rate", "make_row", "mix_stats", "plot_rows", "print_rows", "row_json"]


@dataclass(frozen=True, slots=True)
class MixStats:
    """A short/long mix's own numbers, over the successful requests."""

    short_ttft_s: Dist  # requests tagged short
    long_tpot_s: Dist  # requests tagged long
    e2e_s: Dist  # every request

    def to_json(self) -> dict[str, float | int]:
        return {
            "short_ttft_p50_s": self.short_ttft_s.p50,
            "short_ttft_p90_s": self.short_ttft_s.p90,
            "long_tpot_p90_s": self.long_tpot_s.p90,
            "e2e_p90_s": self.e2e_s.p90,
            "short": self.short_ttft_s.count,
            "long": self.long_tpot_s.count,
        }


def mix_stats(result: LoadResult) -> MixStats | None:
    """The mix's numbers, or None when no request is tagged ``short`` or ``long`` (a LoRA suffix ``/a`` aside)."""
    short: list[float] = []
    long: list[float] = []
    e2e: list[float] = []
    for rec in result.records:
        kind = rec.tag.split("/", 1)[0]
        if not rec.ok or kind not in ("short", "long"):
            continue
        if rec.e2e_s is not None:
            e2e.append(rec.e2e_s)
        if kind == "short" and rec.ttft_s is not None:
            short.append(rec.ttft_s)
        elif kind == "long" and (tpot := rec.tpot_s) is not None:
            long.append(tpot)
    if not short and not long:
        return None
    return MixStats(Dist.of(short), Dist.of(long), Dist.of(e2e))


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    rate: float | None
    result: LoadResult
    summary: Summary
    shares: dict[str, float]  # server name -> share of the successful requests, by name
    imbalance: float
    mix: MixStats | None = None


def make_row(label: str, result: LoadResult, servers: Sequence[str] = (), rate: float | None = None) -> Row:
    summary = summarize(result)
    counts = {name: 0 for name in servers}
    for name, n in summary.backends.items():
        counts[name] = counts.get(name, 0) + n
    total = sum(counts.values())
    ordered = sorted(counts, key=_natural)
    shares = {name: (counts[name] / total if total else 0.0) for name in ordered}
    mean = total / len(counts) if counts else 0.0
    imbalance = max(counts.values()) / mean if mean > 0 else 0.0
    rate_ = rate if rate is not None else result.spec.rate
    return Row(label, rate_, result, summary, shares, imbalance, mix_stats(result))


def row_json(row: Row, *, records: bool = False) -> dict[str, Any]:
    """The load client's JSON (``report.to_json``) plus the label, rate, shares and imbalance."""
    out: dict[str, Any] = {"label": row.label, "rate": row.rate, "shares": row.shares, "imbalance": row.imbalance}
    if row.mix is not None:
        out["mix"] = row.mix.to_json()
    out.update(to_json(row.result, row.summary, records=records))
    return out


def print_rows(title: str, rows: Sequence[Row]) -> None:
    """One table: TTFT p50/p90/p99, TPOT p50, e2e p50, throughput, cache hits, imbalance, per-server share; for a
    short/long mix also the short requests' TTFT p50/p90, the long answers' TPOT p90 and the e2e p90."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 200)
    table = Table(title=title, title_justify="left")
    mix = any(r.mix is not None for r in rows)
    extra = ("short TTFT p50", "short p90", "long TPOT p90", "e2e p90") if mix else ()
    for col in (
        "policy",
        "TTFT p50",
        "p90",
        "p99",
        "TPOT p50",
        "e2e p50",
        *extra,
        "req/s",
        "tok/s",
        "cached",
        "imbal.",
    ):
        table.add_column(col, justify="left" if col == "policy" else "right")
    table.add_column("per-server share %", justify="left")
    table.add_column("failed", justify="right")
    for r in rows:
        s = r.summary
        table.add_row(
            r.label,
            _ms(s.ttft_s.p50),
            _ms(s.ttft_s.p90),
            _ms(s.ttft_s.p99),
            _ms(s.tpot_s.p50),
            f"{s.e2e_s.p50:.2f} s",
            *(_mix_cells(r.mix) if mix else ()),
            f"{s.throughput_rps:.1f}",
            f"{s.output_tok_s:.0f}",
            f"{s.cached_share:.0%}",
            f"{r.imbalance:.2f}",
            " ".join(f"{v * 100:.0f}" for v in r.shares.values()),
            str(s.failed) if s.failed else "",
        )
    console.print(table)


def plot_rows(rows: Sequence[Row], path: str | Path, title: str = "") -> None:
    """TTFT and TPOT distributions (at the highest rate), TTFT p90 against the rate (or TTFT over the run when
    there is one rate) and each server's share, one colour per label."""
    from matplotlib.figure import Figure  # no pyplot: no global state

    fig = Figure(figsize=(13, 8.5), layout="constrained")
    if title:
        fig.suptitle(title)
    ax_ttft, ax_rate, ax_tpot, ax_share = fig.subplots(2, 2).flat
    labels = list(dict.fromkeys(r.label for r in rows))
    rates = sorted({r.rate for r in rows if r.rate is not None})
    top = rates[-1] if rates else None
    last = [r for r in rows if r.rate == top] or list(rows)
    colors = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for r in last:
        ok = [rec for rec in r.result.records if rec.ok]
        ttfts = sorted(rec.ttft_s * 1e3 for rec in ok if rec.ttft_s is not None)
        tpots = sorted(t * 1e3 for rec in ok if (t := rec.tpot_s) is not None)
        for ax, values in ((ax_ttft, ttfts), (ax_tpot, tpots)):
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.plot(values, ys, color=colors[r.label], label=r.label)
    at = f" at {top:g} req/s" if top is not None else ""
    ax_ttft.set(title=f"TTFT{at}", xlabel="ms", ylabel="share of requests", xscale="log")
    ax_tpot.set(title=f"TPOT{at}", xlabel="ms", ylabel="share of requests", xscale="log")
    if len(rates) > 1:
        for label in labels:
            pts = sorted((r.rate, r.summary.ttft_s.p90 * 1e3) for r in rows if r.label == label and r.rate is not None)
            ax_rate.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", color=colors[label], label=label)
        ax_rate.set(title="TTFT p90 against the offered rate", xlabel="req/s", ylabel="ms", yscale="log")
    else:
        for r in last:
            ok = [rec for rec in r.result.records if rec.ok and rec.ttft_s is not None]
            ax_rate.scatter(
                [rec.start_s for rec in ok], [rec.ttft_s * 1e3 for rec in ok if rec.ttft_s is not None],
                s=5, color=colors[r.label], label=r.label,
            )  # fmt: skip
        ax_rate.set(title="TTFT over the run", xlabel="request start (s)", ylabel="ms", yscale="log")
    servers = list(dict.fromkeys(name for r in last for name in r.shares))
    width = 0.8 / max(1, len(last))
    for j, r in enumerate(last):
        xs = [i + j * width for i in range(len(servers))]
        ax_share.bar(xs, [r.shares.get(s, 0.0) * 100 for s in servers], width, color=colors[r.label], label=r.label)
    ax_share.set_xticks([i + width * (len(last) - 1) / 2 for i in range(len(servers))], servers, rotation=45)
    ax_share.set(title=f"requests per server{at}", ylabel="% of requests")
    for ax in (ax_ttft, ax_rate, ax_tpot, ax_share):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.savefig(str(path), dpi=100)


def _mix_cells(m: MixStats | None) -> tuple[str, ...]:
    if m is None:
        return ("-",) * 4
    return (_ms(m.short_ttft_s.p50), _ms(m.short_ttft_s.p90), _ms(m.long_tpot_s.p90), f"{m.e2e_s.p90:.2f} s")


def by_rate(rows: Sequence[Row]) -> Mapping[float | None, list[Row]]:
    out: dict[float | None, list[Row]] = {}
    for r in rows:
        out.setdefault(r.rate, []).append(r)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f} ms" if seconds >= 0.0995 else f"{seconds * 1e3:.1f} ms"


def _natural(name: str) -> tuple[Any, ...]:
    """Sort "sim-2" before "sim-10"."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return (head, int(tail) if tail else -1)
