"""Structured logging: one JSON object per line (``--zap-encoder json``, the default) or plain text.

Fields: ``ts`` (RFC 3339 UTC), ``level``, ``logger``, ``msg``, any ``extra={...}`` keys, and ``stacktrace`` for
exceptions. Prompt text and bodies are never logged at info level; code that wants them checks
``log.isEnabledFor(logging.DEBUG)`` first (which also keeps the hot path free of formatting work).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, TextIO

import orjson

__all__ = ["JsonFormatter", "configure", "level_from_verbosity"]

# LogRecord attributes that are not user-supplied ``extra`` fields.
_RESERVED = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["stacktrace"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def level_from_verbosity(v: int) -> int:
    """The reference's ``--v`` scale: 0-3 info, 4 debug, 5+ trace (debug here)."""
    return logging.DEBUG if v >= 4 else logging.INFO


def configure(level: str | int = "info", fmt: str = "json", stream: TextIO | None = None) -> None:
    """Set up the root logger once (``picker serve`` calls this before anything logs)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    # grpc and aiohttp access logs are noise at info level.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
