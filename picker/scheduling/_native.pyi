from collections.abc import Callable, Container, Mapping, Sequence

from picker.endpoints.inflight import EndpointLoad
from picker.endpoints.model import Endpoint
from picker.scheduling.plugins.prefix_index import Index

def prefix_hashes(text: str, block_bytes: int, max_blocks: int, model: str, salt: str = "") -> tuple[int, ...]: ...
def match(holders: dict[int, str | set[str]], hashes: Sequence[int]) -> dict[str, int]: ...
def tokens_of(
    endpoints: Sequence[Endpoint],
    loads: Mapping[str, EndpointLoad],
    now: float,
    request_tokens: float,
    decode_tokens: float,
    max_age_s: float,
    mode: int = 0,  # 0: tokens_of; 1: requests_of; 2: waiting_of
) -> list[float] | None: ...
def select(
    endpoints: Sequence[Endpoint], loads: list[float], k: int, held: Container[str] | None
) -> list[Endpoint] | None: ...

# A type: picker/scheduling/plugins/prefix_index.py's PyPrefixIndex in C (the Index protocol states its methods).
PrefixIndex: Callable[[int], Index]
