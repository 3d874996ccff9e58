"""Configuration values in Kubernetes spelling: Go durations (``200ms``, ``1m30s``) and resource quantities
(``1Gi``, ``500M``), as the EndpointPickerConfig writes them. Plain numbers are seconds / bytes.

Both raise ``ValueError`` (pydantic validators turn it into a ``ConfigError`` naming the key). The command
line spells them the same way: ``duration_arg``, ``bool_arg`` and ``port_arg`` are the argparse ``type``s of
picker's flags, and ``at_least``, ``above`` and ``fraction`` make those of numbers with a range.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "NumberArg",
    "above",
    "at_least",
    "bool_arg",
    "duration_arg",
    "duration_s",
    "fraction",
    "port_arg",
    "quantity",
]

N = TypeVar("N", int, float)

_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_QUANTITY = re.compile(r"([+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?")
_SUFFIX = {
    "": 1.0,
    "m": 1e-3,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def duration_s(value: object) -> float:
    """Seconds from a Go duration string or a number of seconds; negative or malformed ⇒ ``ValueError``."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            pos, seconds = 0, 0.0
            for match in _DURATION.finditer(text):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNIT_S[match.group(2)]
                pos = match.end()
            if pos != len(text) or not text:
                raise ValueError(f"{value!r} is not a duration like 200ms, 2s, 1m30s") from None
    else:
        raise ValueError(f"{value!r} is not a duration")
    if seconds < 0:
        raise ValueError(f"{value!r}: a duration can't be negative")
    return seconds


def bool_arg(text: str) -> bool:
    """A true/false flag value (``--secure-serving=false``) as an argparse ``type``: true, 1, yes, on or false, 0,
    no, off, in any case."""
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def add_bool_flag(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, flag: str, *, default: bool, help: str
) -> None:
    """A Go-style boolean flag, as the reference EPP's: ``--flag`` alone is true, ``--flag=false`` (or any
    ``bool_arg`` value) sets it."""
    parser.add_argument(flag, type=bool_arg, nargs="?", const=True, default=default, metavar="BOOL", help=help)


def duration_arg(text: str) -> float:
    """``duration_s`` as an argparse ``type``: a bad value is a usage error naming the flag."""
    try:
        return duration_s(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def port_arg(text: str) -> int:
    """A TCP port flag (``--grpc-port 9002``; 0: any free port) as an argparse ``type``: 0 to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is 0 to 65535")
    return port


def quantity(value: object) -> int:
    """An integer amount (bytes, requests) from a Kubernetes quantity (``1Gi``, ``500M``, ``1e6``) or a number."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        amount = float(value)
    elif isinstance(value, float):
        amount = value
    elif isinstance(value, str):
        match = _QUANTITY.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{value!r} is not a quantity like 1Gi, 500M or 1000")
        amount = float(match.group(1)) * _SUFFIX[match.group(2) or ""]
    else:
        raise ValueError(f"{value!r} is not a quantity")
    if amount < 0:
        raise ValueError(f"{value!r}: a quantity can't be negative")
    return int(amount)


@dataclass(frozen=True)
class NumberArg(Generic[N]):
    """An argparse ``type``: a number of ``kind`` at or above ``low`` (``strict``: above it). Made by ``at_least``
    and ``above``; a class, not a closure, so the documentation can tell what a flag takes."""

    kind: type[N]
    low: float
    strict: bool = False

    def __call__(self, text: str) -> N:
        value = _one(text, self.kind)
        if value < self.low or (self.strict and value == self.low):
            raise argparse.ArgumentTypeError(f"{text!r}: {'above' if self.strict else 'at least'} {self.low:g}")
        return value


def at_least(low: float, kind: type[N] = int) -> NumberArg[N]:
    """An argparse ``type``: a number of ``kind`` (int unless said) that is ``>= low``."""
    return NumberArg(kind, low)


def above(low: float, kind: type[N] = float) -> NumberArg[N]:  # type: ignore[assignment]
    """An argparse ``type``: a number of ``kind`` (float unless said) that is ``> low``."""
    return NumberArg(kind, low, strict=True)


def fraction(text: str) -> float:
    """An argparse ``type``: a share from 0 to 1."""
    value = _one(text, float)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: a share from 0 to 1")
    return value


def _one(text: str, kind: type[N]) -> N:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value
