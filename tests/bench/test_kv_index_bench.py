"""``picker bench kv-index`` at a CI size: the numbers are computed from real work and are sane."""

from __future__ import annotations

import argparse

import pytest

from picker.bench import kv_index


def test_memory_and_ingest_at_a_small_size() -> None:
    mem = kv_index.memory(20_000, 8, 64, 0.1)
    assert mem["entries"] == 20_000
    assert 60 < mem["bytes_per_entry"] < 1000
    rate = kv_index.ingest_rate(5_000, 16, 1, 8)
    assert 5_000 <= rate["events"] < 5_016  # whole messages of 16
    assert rate["unknown_parent"] == 0
    assert rate["events_per_s_cpu"] > 1_000
    assert kv_index.lookup_us(4, rounds=10) > 0
    assert kv_index.lookup_us(4, rounds=10, python=True) > 0
    assert kv_index.keys_us(rounds=10) > 0
    assert kv_index.keys_us(rounds=10, python=True) > 0


def test_command_prints_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    kv_index.configure(parser)
    args = parser.parse_args(["--blocks", "5000", "--events", "2000", "--endpoints", "4"])
    assert kv_index.run(args) == 0
    out = capsys.readouterr().out
    assert "MiB per million blocks" in out
    assert "events/s CPU" in out
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0] in {"1", "4", "16"}]
    assert [r[0] for r in rows] == ["1", "4", "16"]
    assert all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows)


def test_lookup_only_skips_memory_and_ingest(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    kv_index.configure(parser)
    assert kv_index.run(parser.parse_args(["--lookup-only", "--endpoints", "2"])) == 0
    out = capsys.readouterr().out
    assert "MiB" not in out
    assert "longest-prefix match" in out
    assert "block keys of a 4000-token prompt" in out
