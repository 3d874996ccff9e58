"""Structured logs: one JSON object per line with extra fields; text format; verbosity mapping."""

from __future__ import annotations

import io
import logging

import orjson

from picker.telemetry import logs


def test_json_lines_carry_extra_fields_and_stack_traces() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("debug", "json", stream=out)
        log = logging.getLogger("picker.test")
        log.info("routed %s", "x", extra={"request_id": "r1", "destination": "10.0.0.1:8000"})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("failed")
        first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
        assert first["msg"] == "routed x"
        assert first["level"] == "info"
        assert first["logger"] == "picker.test"
        assert (first["request_id"], first["destination"]) == ("r1", "10.0.0.1:8000")
        assert first["ts"].endswith("Z")
        assert "ValueError: boom" in second["stacktrace"]
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_text_format_and_levels() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("warning", "text", stream=out)
        logging.getLogger("picker.test").info("hidden")
        logging.getLogger("picker.test").warning("shown")
        assert "hidden" not in out.getvalue()
        assert "WARNING picker.test: shown" in out.getvalue()
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert logs.level_from_verbosity(4) == logging.DEBUG
    assert logs.level_from_verbosity(2) == logging.INFO
