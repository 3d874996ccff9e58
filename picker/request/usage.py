"""Response-path usage accounting (protocol.md §6): token counts from a JSON response or an SSE stream.

JSON: ``usage.{prompt_tokens, completion_tokens, total_tokens}`` (chat, completions, embeddings) or
``usage.{input_tokens, output_tokens}`` (Responses / Conversations); cached prompt tokens from
``usage.prompt_tokens_details.cached_tokens`` (the plural key vLLM and OpenAI emit; the reference reads a
singular key that never exists) or ``usage.input_tokens_details.cached_tokens``.

SSE: ``data:`` lines, split across chunks as the network splits them; ``[DONE]`` skipped; the first event with a
non-null ``usage`` wins; a Responses ``response.completed`` event carries it in ``response.usage``. The scanner
also notes the first event and the first event carrying output (for TTFT). Buffers are bounded: a line longer
than the cap is dropped, not grown forever.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["SSEUsageScanner", "Usage", "json_usage", "usage_from"]

_DATA = b"data:"
_DONE = b"[DONE]"
_USAGE_HINT = b'"usage"'


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache


def json_usage(body: bytes) -> Usage | None:
    """The usage of a complete (non-streamed) JSON response; None if it has none or is not JSON."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    return usage_from(doc.get("usage"))


def usage_from(usage: Any) -> Usage | None:
    """A ``Usage`` from a response's ``usage`` object (either naming convention)."""
    if not isinstance(usage, dict):
        return None
    prompt = _first_int(usage, "prompt_tokens", "input_tokens")
    completion = _first_int(usage, "completion_tokens", "output_tokens")
    total = _int(usage.get("total_tokens"))
    if total is None:
        total = (prompt or 0) + (completion or 0)
    cached = 0
    for key in ("prompt_tokens_details", "input_tokens_details"):
        details = usage.get(key)
        if isinstance(details, dict):
            value = _int(details.get("cached_tokens"))
            if value is not None:
                cached = value
                break
    return Usage(prompt_tokens=prompt or 0, completion_tokens=completion or 0, total_tokens=total, cached_tokens=cached)


class SSEUsageScanner:
    """Feed it the chunks of a ``text/event-stream`` response in order; read ``usage`` at the end."""

    __slots__ = ("_max_line_bytes", "_partial", "_skipping", "done", "events", "first_token_seen", "usage")

    def __init__(self, *, max_line_bytes: int = 1 << 20) -> None:
        self._max_line_bytes = max_line_bytes
        self._partial = bytearray()
        self._skipping = False  # inside a line that outgrew the cap: drop until its newline
        self.usage: Usage | None = None
        self.events = 0  # data events seen ([DONE] excluded)
        self.first_token_seen = False  # an event carrying output text / tokens has been seen
        self.done = False  # [DONE] or response.completed seen

    @property
    def first_event_seen(self) -> bool:
        return self.events > 0

    def feed(self, chunk: bytes) -> None:
        start = 0
        n = len(chunk)
        while start < n:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                self._hold(chunk, start, n)
                return
            if self._skipping:
                self._skipping = False
            elif self._partial:
                if len(self._partial) + (nl - start) <= self._max_line_bytes:
                    self._partial += chunk[start:nl]
                    self._line(bytes(self._partial))
                self._partial.clear()
            else:
                self._line(chunk[start:nl])
            start = nl + 1

    def close(self) -> None:
        """End of stream: a last line without a newline still counts."""
        if self._partial and not self._skipping:
            self._line(bytes(self._partial))
        self._partial.clear()
        self._skipping = False

    def _hold(self, chunk: bytes, start: int, end: int) -> None:
        if self._skipping:
            return
        if len(self._partial) + (end - start) > self._max_line_bytes:
            self._partial.clear()
            self._skipping = True
            return
        self._partial += chunk[start:end]

    def _line(self, line: bytes) -> None:
        if not line.startswith(_DATA):
            return
        payload = line[5:].strip()
        if not payload:
            return
        if payload == _DONE:
            self.done = True
            return
        self.events += 1
        # Parse only when it can tell us something: output not yet seen, or a usage-bearing event.
        if self.first_token_seen and (self.usage is not None or _USAGE_HINT not in payload):
            return
        try:
            event = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if not isinstance(event, dict):
            return
        if not self.first_token_seen and _has_output(event):
            self.first_token_seen = True
        if self.usage is None:
            if event.get("type") == "response.completed":
                self.done = True
                response = event.get("response")
                if isinstance(response, dict):
                    self.usage = usage_from(response.get("usage"))
            else:
                self.usage = usage_from(event.get("usage"))


def _has_output(event: Mapping[str, Any]) -> bool:
    """Whether an event carries generated output (a first token), not just a role header or usage."""
    choices = event.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            if choice.get("text"):
                return True
            delta = choice.get("delta")
            if isinstance(delta, dict) and (
                delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls")
            ):
                return True
        return False
    kind = event.get("type")
    return isinstance(kind, str) and kind.endswith(".delta")  # Responses API: response.output_text.delta, ...


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _first_int(usage: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = _int(usage.get(key))
        if value is not None:
            return value
    return None
