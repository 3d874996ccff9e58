"""The comma-list flags of the bench commands (``--rates 20,40``, ``--seeds 0-9``, ``--policies rr,picker``).

One parser for all of them, so a bad value is the same clear usage error everywhere: a ``ValueError`` whose text
names the flag and the value given, which each command prints as ``picker bench NAME: ...`` and exits 2 on.
Single numbers with a range are argparse ``type``s: ``picker.scheduling.units``' ``at_least``, ``above``,
``fraction``.
"""

from __future__ import annotations

import math
from typing import TypeVar

__all__ = ["names", "numbers"]

N = TypeVar("N", int, float)


def names(text: str) -> list[str]:
    """The items of a comma list, stripped, empty ones dropped (``"a, b,"`` -> ``["a", "b"]``)."""
    return [item for part in text.split(",") if (item := part.strip())]


def numbers(
    text: str,
    flag: str,
    kind: type[N],
    *,
    least: float | None = None,
    above: float | None = None,
    ranges: bool = False,
    distinct: bool = False,
) -> list[N]:
    """The numbers of a comma list given to ``flag``, in order; at least one.

    ``least``/``above``: each must be ``>= least`` / ``> above``. ``ranges`` (integers only): an item ``a-b`` is
    ``a, a+1, ..., b`` (so negative numbers cannot be given). ``distinct``: none may come twice.
    ValueError, naming ``flag`` and the value, for anything else.
    """
    integers = kind is int
    if ranges and not integers:
        raise TypeError("ranges are of integers")
    shape = f"a comma list of {'integers' if integers else 'numbers'}" + (" or ranges (0-9)" if ranges else "")
    values: list[N] = []
    try:
        for item in names(text):
            first, dash, last = item.partition("-")
            if ranges and dash and first:
                low, high = int(first), int(last)
                if high < low:
                    raise ValueError
                values += [kind(v) for v in range(low, high + 1)]
            else:
                values.append(kind(item))
        if not all(math.isfinite(v) for v in values):
            raise ValueError
    except ValueError:
        raise ValueError(f"{flag} {text!r}: {shape}") from None
    if not values:
        raise ValueError(f"{flag} {text!r}: {shape}, at least one")
    if least is not None and min(values) < least:
        raise ValueError(f"{flag} {text!r}: each at least {least:g}")
    if above is not None and min(values) <= above:
        raise ValueError(f"{flag} {text!r}: each above {above:g}")
    if distinct and len(set(values)) != len(values):
        raise ValueError(f"{flag} {text!r}: none twice")
    return values
