"""ScrapeError: why one poll of a model server's ``/metrics`` produced no metrics.

``reason`` is a short fixed word (the ``reason`` label of ``picker_scrape_errors_total``); the message says
what happened to this endpoint. Raised by the engine mappings (``parse``, ``missing``, ``value``) and the
poller (``http``, ``timeout``, ``connect``, ``too_large``, ``internal``); never reaches a request stream.
"""

from __future__ import annotations

from typing import Final

__all__ = ["REASONS", "ScrapeError"]

REASONS: Final = ("http", "timeout", "refused", "connect", "too_large", "parse", "missing", "value", "internal")


class ScrapeError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown scrape error reason {reason!r}")
        super().__init__(message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"
