from collections.abc import Sequence

def match(
    keys: Sequence[int], holders_of: dict[int, int | dict[int, int]], wanted: dict[int, str], weight: list[float]
) -> dict[str, float]: ...
