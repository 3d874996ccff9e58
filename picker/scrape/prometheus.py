"""A selective parser of the Prometheus text exposition format (version 0.0.4): bytes in, samples out.

It extracts only the metric names it is asked for and skips everything else without tokenising it. A vLLM
``/metrics`` page is ~50 KB and mostly histogram buckets that picker never reads; instead of splitting every
line, ``scan`` runs one regex that jumps from newline to newline in C and tries the wanted names only there,
then parses just the matching lines. A wanted name counts only at the start of a line (after optional blanks)
and followed by ``{``, a blank or a tab (or the line's end, reported as malformed), so ``# HELP``/``# TYPE``
comments, longer names sharing the prefix (``x`` vs ``x_bucket``) and label values never match. Literal
newlines cannot occur inside a label value (the format escapes them), so a match can never start inside one.

Covered: label values with escaped quotes/backslashes/newlines and with ``,`` or ``}`` inside the quotes,
trailing commas, blanks around tokens, ``{}``, names with colons, optional integer timestamps (milliseconds),
``NaN``/``+Inf``/``-Inf``, comments, CRLF line ends. A malformed line of a *wanted* metric raises
``ExpositionError``; malformed lines of other metrics are never looked at.

Pure functions over bytes; no I/O.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["ExpositionError", "Sample", "Selector", "pick_largest_value", "pick_latest", "scan"]

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
# One `name="value"` label pair. The value allows any character but `"`, `\` and newline, plus backslash
# escapes: a quote, comma or brace inside the quotes is just part of the value.
_LABEL_NAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_LABEL_VALUE = r'[^"\\\n]*(?:\\.[^"\\\n]*)*'
_PAIRS = re.compile(rf'[ \t]*({_LABEL_NAME})[ \t]*=[ \t]*"({_LABEL_VALUE})"[ \t]*')
_BARE_PAIR = rf'[ \t]*{_LABEL_NAME}[ \t]*=[ \t]*"{_LABEL_VALUE}"[ \t]*'.encode()
# The rest of a sample line after its name: optional label set (pairs, optional trailing comma), blanks, value,
# optional timestamp, end of line. Validated in one C-level match; the pairs are then read with findall.
_REST = re.compile(
    rb"(?:[ \t]*\{(" + _BARE_PAIR + rb"(?:," + _BARE_PAIR + rb")*,?[ \t]*|[ \t]*)\})?"
    rb"[ \t]+([^ \t\r\n]+)(?:[ \t]+([^ \t\r\n]+))?[ \t]*\r?(?:\n|\Z)"
)
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


class ExpositionError(ValueError):
    """A line of a wanted metric does not follow the text exposition format."""


class Sample(NamedTuple):
    # A NamedTuple, not a frozen dataclass: built per wanted line, and 4x cheaper to construct.
    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Selector:
    """A PromQL-style instant-vector selector with equality matchers: ``name`` or ``name{k=v,k2="v 2"}``."""

    name: str
    matchers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, spec: str) -> Selector:
        """Parse ``name{label=value,...}``; label values may be quoted or bare (as in the reference specs)."""
        spec = spec.strip()
        name, brace, rest = spec.partition("{")
        name = name.strip()
        if not _NAME.match(name):
            raise ValueError(f"bad metric name in selector {spec!r}")
        if not brace:
            return cls(name)
        if not rest.endswith("}"):
            raise ValueError(f"selector {spec!r} lacks a closing brace")
        matchers: list[tuple[str, str]] = []
        for part in rest[:-1].split(","):
            if not part.strip():
                continue
            key, eq, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if not eq or not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", key) or value.startswith("~"):
                raise ValueError(f"selector {spec!r}: only label=value matchers are supported")
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            matchers.append((key, value))
        return cls(name, tuple(matchers))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.matchers)

    def __str__(self) -> str:
        if not self.matchers:
            return self.name
        return self.name + "{" + ",".join(f'{k}="{v}"' for k, v in self.matchers) + "}"


def scan(page: bytes, names: Iterable[str]) -> dict[str, list[Sample]]:
    """The samples of each wanted metric name, in page order (names absent from the page map to ``[]``)."""
    wanted = frozenset(names)
    found: dict[str, list[Sample]] = {name: [] for name in wanted}
    if not wanted:
        return found
    first_line, other_lines = _patterns(wanted)
    m = first_line.match(page)
    if m is not None:
        found[m.group(1).decode()].append(_parse_line(page, m.group(1).decode(), m.end()))
    for m in other_lines.finditer(page):
        name = m.group(1).decode()
        found[name].append(_parse_line(page, name, m.end()))
    return found


def pick_latest(samples: Iterable[Sample], selector: Selector) -> Sample | None:
    """The reference series choice: among matching series the one with the largest timestamp, else the first."""
    best: Sample | None = None
    for s in samples:
        if not selector.matches(s.labels):
            continue
        if best is None or (
            s.timestamp_ms is not None and (best.timestamp_ms is None or s.timestamp_ms > best.timestamp_ms)
        ):
            best = s
    return best


def pick_largest_value(samples: Iterable[Sample], selector: Selector) -> Sample | None:
    """The matching series with the largest value (NaN never wins); used where the value is a timestamp."""
    best: Sample | None = None
    for s in samples:
        if not selector.matches(s.labels) or math.isnan(s.value):
            continue
        if best is None or s.value > best.value:
            best = s
    return best


@functools.lru_cache(maxsize=64)
def _patterns(names: frozenset[str]) -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """Regexes finding a wanted name at the start of the page and at the start of any later line.

    The second begins with the literal newline, so the regex engine jumps from newline to newline in C and tries
    the names only there: ~3x faster than one ``bytes.find`` pass per name on a vLLM page.
    """
    alternatives = b"|".join(re.escape(n.encode()) for n in sorted(names))
    # What follows the name: labels, a blank, or (malformed, but then reported) the end of the line.
    name = rb"[ \t]*(" + alternatives + rb")(?=[{ \t\r\n]|\Z)"
    return re.compile(name), re.compile(rb"\n" + name)


def _parse_line(page: bytes, name: str, pos: int) -> Sample:
    """Parse the rest of a sample line from just after the name."""
    m = _REST.match(page, pos)
    if m is None:
        raise ExpositionError(f"{name}: expected `[{{labels}}] value [timestamp]` in line {_line_at(page, pos)!r}")
    block, value_text, timestamp_text = m.groups()
    labels: dict[str, str] = {}
    if block:
        for key, raw in _PAIRS.findall(block.decode("utf-8", "replace")):
            labels[key] = _ESCAPE.sub(_unescape, raw) if "\\" in raw else raw
    try:
        value = float(value_text)
        timestamp_ms = int(timestamp_text) if timestamp_text is not None else None
    except ValueError as exc:
        raise ExpositionError(f"{name}: bad number in line {_line_at(page, pos)!r}") from exc
    return Sample(name, labels, value, timestamp_ms)


def _unescape(m: re.Match[str]) -> str:
    return _UNESCAPED.get(m.group(1), m.group(0))


def _line_at(page: bytes, pos: int) -> str:
    start = page.rfind(b"\n", 0, pos) + 1
    end = page.find(b"\n", pos)
    return page[start : end if end != -1 else len(page)][:200].decode("utf-8", "replace")
