"""The CI-sized soak: 2 minutes through the real Envoy with pods churning every 3 s; every goal must hold.

The documented run is ``picker bench soak --duration 30m --png soak.png`` (docs/reliability.md)."""

from __future__ import annotations

import pytest

from picker.bench.soak import SoakSpec, soak

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.timeout(400)
async def test_two_minute_soak_with_churn_meets_its_goals() -> None:
    report = await soak(SoakSpec(duration_s=120.0, rate=15.0, churn_s=3.0, sample_s=5.0))
    print("\n" + report.table())
    assert report.churn_events >= 30
    assert len(report.samples) >= 20
    assert report.ok(), report.table()


def test_checks_fail_on_growth_and_leaked_leases() -> None:
    from picker.bench.soak import Sample, SoakReport

    def s(t: float, rss: float, leases: int = 0) -> Sample:
        return Sample(t, rss, 20, 10, 0, leases, 0.1, 10, 0, 3)

    report = SoakReport(SoakSpec(duration_s=100.0), samples=[s(10, 100), s(30, 100), s(100, 115)], requests=30)
    report.final_leases = 2
    failed = {name for name, _, ok in report.checks() if not ok}
    assert failed == {"RSS growth after warm-up", "in-flight leases after the load"}


def test_plot_draws_every_panel(tmp_path: object) -> None:
    from pathlib import Path

    from picker.bench.soak import Sample, SoakReport, plot

    samples = [Sample(5.0 * i, 100.0 + i, 20, 10, 1, 2, 0.1, 50, 0, 3) for i in range(10)]
    path = Path(str(tmp_path)) / "soak.png"
    plot(SoakReport(SoakSpec(duration_s=50.0), samples=samples), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_rss_slope_is_judged_only_over_a_long_enough_window() -> None:
    from picker.bench.soak import MAX_RSS_SLOPE_MB_H, Sample, SoakReport

    def run(minutes: float, mb_per_hour: float) -> SoakReport:
        samples = [
            Sample(t, 100.0 + mb_per_hour * t / 3600, 20, 10, 0, 0, 0.1, 10, 0, 3)
            for t in range(0, int(minutes * 60) + 1, 30)
        ]
        report = SoakReport(SoakSpec(duration_s=minutes * 60), samples=samples, requests=30)
        report.final_leases = 0
        return report

    slope, window_s = run(30, 12.0).rss_slope_mb_h() or (0.0, 0.0)
    assert slope == pytest.approx(12.0)
    assert window_s == pytest.approx(24 * 60)
    failed = {name for name, _, ok in run(30, 2 * MAX_RSS_SLOPE_MB_H).checks() if not ok}
    assert failed == {f"RSS slope after warm-up (goal < {MAX_RSS_SLOPE_MB_H:g} MB/hour)"}
    assert run(30, MAX_RSS_SLOPE_MB_H / 2).ok()
    assert run(2, 100.0).ok()  # two minutes: reported, not judged (the 10 % growth check still is)
