"""The native hot path (``picker.scheduling._native``) against its pure-Python twins: equal on randomized inputs."""

from __future__ import annotations

import random

import pytest
import xxhash

from picker.bench.overhead import prompt_bodies
from picker.bench.schedule import bench_endpoints
from picker.request.parse import parse_request
from picker.scheduling.config import load_config
from picker.scheduling.plugins import prefix, prefix_index
from picker.scheduling.plugins.prefix_index import PrefixIndex, py_match, py_prefix_hashes
from picker.scheduling.scheduler import Scheduler
from tests.scheduling.helpers import ctx

native = pytest.importorskip("picker.scheduling._native", reason="C extension not built (no compiler at install)")

# ASCII, 2-, 3- and 4-byte UTF-8 characters: block cuts land inside characters too.
ALPHABET = "abcdefghij KLMNOP 0123456789 .,\n\té ß ñ ü € 中文 字 🙂 🚀"


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


def test_xxh64_matches_the_xxhash_library_at_every_length() -> None:
    # h0 = xxh64(model) over 0..199 bytes, h1 = xxh64(block ‖ le64(h0)) over 9..208: every stripe and tail path
    for n in range(200):
        model, text = "m" * n, "t" * (n + 1)
        h0 = xxhash.xxh64_intdigest(model.encode())
        expected = xxhash.xxh64_intdigest(text.encode() + h0.to_bytes(8, "little"))
        assert native.prefix_hashes(text, n + 1, 1, model) == (expected,)


def test_prefix_hashes_equal_on_random_prompts() -> None:
    rng = random.Random(13)
    for _ in range(2000):
        text = _text(rng, rng.randrange(0, 700))
        block = rng.choice([1, 3, 7, 16, 31, 64, 100, 257])
        max_blocks = rng.choice([0, 1, 2, 5, 256, 10_000])
        model = _text(rng, rng.randrange(0, 20))
        salt = rng.choice(["", _text(rng, rng.randrange(1, 10))])
        assert native.prefix_hashes(text, block, max_blocks, model, salt) == py_prefix_hashes(
            text, block, max_blocks, model, salt
        ), (text, block, max_blocks, model, salt)
    assert native.prefix_hashes("abcd" * 40, 16, 256, "m") == py_prefix_hashes("abcd" * 40, 16, 256, "m")
    assert native.prefix_hashes("abcd" * 40, 0, 256, "m") == py_prefix_hashes("abcd" * 40, 0, 256, "m") == ()


def test_match_equal_on_random_indexes() -> None:
    rng = random.Random(7)
    keys = [f"10.0.0.{i}:8000" for i in range(12)]
    for _ in range(200):
        index = PrefixIndex(capacity_per_endpoint=rng.choice([5, 50, 500]))
        prompts = [tuple(rng.randrange(1, 2**64) for _ in range(rng.randrange(1, 40))) for _ in range(8)]
        for _ in range(rng.randrange(0, 30)):
            chain = rng.choice(prompts)
            index.add(rng.choice(keys), chain[: rng.randrange(1, len(chain) + 1)])
        if rng.random() < 0.3:
            index.retain(rng.sample(keys, rng.randrange(0, len(keys))))
        holders = index._holders
        for chain in prompts:
            assert native.match(holders, chain) == py_match(holders, chain)
            assert native.match(holders, list(chain)) == py_match(holders, chain)
        assert native.match(holders, ()) == {}


def test_the_module_uses_native_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (prefix_index.prefix_hashes is native.prefix_hashes) == prefix_index.NATIVE
    monkeypatch.setenv("PICKER_NATIVE", "0")
    assert prefix_index._load_native() is None
    monkeypatch.setenv("PICKER_NATIVE", "1")
    assert prefix_index._load_native() is native


def test_bad_arguments_raise_like_python() -> None:
    with pytest.raises(TypeError):
        native.prefix_hashes(b"bytes", 16, 256, "m")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        native.match([], (1, 2))  # type: ignore[arg-type]


def test_the_default_scheduler_decides_the_same_on_either_path(monkeypatch: pytest.MonkeyPatch) -> None:
    requests = [parse_request({":path": "/v1/completions"}, body) for body in prompt_bodies(4096)]
    rng = random.Random(3)
    order = [rng.randrange(len(requests)) for _ in range(300)]

    def picks() -> list[str]:
        c = ctx()
        scheduler = Scheduler(load_config(None, c), c)
        eps = bench_endpoints(24, now=c.clock())
        out = []
        for i in order:
            result = scheduler.schedule(requests[i], eps)
            scheduler.pre_request(requests[i], result)
            out.append(result.targets[0].key)
        return out

    fast = picks()
    monkeypatch.setattr(prefix, "prefix_hashes", py_prefix_hashes)
    monkeypatch.setattr(prefix_index, "_match", py_match)
    assert picks() == fast
