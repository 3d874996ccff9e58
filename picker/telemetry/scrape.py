"""Prometheus metrics of the model-server scraper and of endpoint freshness (in ``picker.telemetry.REGISTRY``).

The reference EPP exports nothing about failed scrapes (model-servers.md §3); these are picker's additions:

* ``picker_scrape_errors_total{endpoint, reason}`` — failed polls; ``reason`` is a ``ScrapeError`` reason
  (http, timeout, connect, too_large, parse, missing, value, internal).
* ``picker_scrape_duration_seconds`` — wall time of every poll (request, body, parse), good or bad.
* ``picker_endpoint_metrics_age_seconds{endpoint}`` — time since the endpoint's last good scrape (since it
  appeared, if never scraped); refreshed every poll tick.
* ``picker_endpoint_excluded{endpoint}`` — 1 while stale/failing scrapes keep it out of scheduling, else 0.
* ``picker_endpoint_exclusion_transitions_total{direction, reason}`` — ``direction`` excluded|readmitted;
  ``reason`` failing|stale for exclusions, recovered for readmissions.

Per-endpoint series are removed when the endpoint leaves the pool (``forget_endpoint``), so pod churn does not
grow the page without bound.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge, Histogram

from picker.telemetry import REGISTRY

__all__ = [
    "ENDPOINT_EXCLUDED",
    "EXCLUSION_TRANSITIONS",
    "METRICS_AGE",
    "SCRAPE_DURATION",
    "SCRAPE_ERRORS",
    "forget_endpoint",
]

SCRAPE_ERRORS = Counter(
    "picker_scrape_errors",
    "Failed polls of a model server's metrics endpoint, by endpoint and reason.",
    ["endpoint", "reason"],
    registry=REGISTRY,
)
SCRAPE_DURATION = Histogram(
    "picker_scrape_duration_seconds",
    "Wall time of one poll of a model server's metrics endpoint (request, body and parse).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)
METRICS_AGE = Gauge(
    "picker_endpoint_metrics_age_seconds",
    "Seconds since the endpoint's last good metrics scrape (since it appeared, if never scraped).",
    ["endpoint"],
    registry=REGISTRY,
)
ENDPOINT_EXCLUDED = Gauge(
    "picker_endpoint_excluded",
    "1 while failing or stale metrics keep the endpoint out of scheduling, else 0.",
    ["endpoint"],
    registry=REGISTRY,
)
EXCLUSION_TRANSITIONS = Counter(
    "picker_endpoint_exclusion_transitions",
    "Endpoints taken out of (direction=excluded) or returned to (direction=readmitted) scheduling.",
    ["direction", "reason"],
    registry=REGISTRY,
)


def forget_endpoint(endpoint: str, reasons: Iterable[str]) -> None:
    """Drop the per-endpoint series of an endpoint that left the pool (``reasons``: all error reasons)."""
    # remove() is a no-op for a label set that was never used.
    METRICS_AGE.remove(endpoint)
    ENDPOINT_EXCLUDED.remove(endpoint)
    for reason in reasons:
        SCRAPE_ERRORS.remove(endpoint, reason)
