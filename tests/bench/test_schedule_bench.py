"""``picker bench schedule`` runs and prints one row per endpoint count and prompt size."""

from __future__ import annotations

import pytest

from picker import cli


def test_schedule_bench_prints_a_row_per_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        cli.main(["bench", "schedule", "--endpoints", "4,8", "--sizes", "512", "--cycles", "20", "--repeat", "1"]) == 0
    )
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("4", "0"), ("8", "0")]
    assert all(float(r[3]) > 0 for r in rows)


def test_whole_path_column_times_the_request_through_a_started_picker(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "schedule", "--endpoints", "4", "--sizes", "512", "--cycles", "20", "--repeat", "1"]
    assert cli.main([*argv, "--whole-path"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[-3:] == ["whole", "path", "us/req"]
    cycle_us, path_us = float(row.split()[3]), float(row.split()[4])
    # Both are timed from real work; no order between them is asserted (20 cycles on a loaded machine can put a
    # preemption in either).
    assert path_us > 0
    assert cycle_us > 0


def test_fresh_and_peers_run(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "schedule", "--endpoints", "4", "--sizes", "512", "--cycles", "20", "--repeat", "2"]
    assert cli.main([*argv, "--fresh", "--peers", "--whole-path"]) == 0
    _, row = capsys.readouterr().out.splitlines()
    assert float(row.split()[3]) > 0
    assert float(row.split()[4]) > 0


def test_fresh_prompts_share_no_block() -> None:
    import orjson

    from picker.bench.overhead import fresh_prompt_bodies, prompt_bodies
    from picker.scheduling.plugins.prefix_index import prefix_hashes

    bodies = fresh_prompt_bodies(4096, 80)  # more than the 32 base prompts: each is used several times
    prompts = [orjson.loads(b)["prompt"] for b in bodies]
    first_blocks = {prefix_hashes(p, 64, 256, "m")[0] for p in prompts}
    assert len(first_blocks) == 80  # block hashes chain: a new first block makes every block new
    base = [orjson.loads(b)["prompt"] for b in prompt_bodies(4096)]
    assert all(p.split(" ", 1)[1] == base[i % len(base)] for i, p in enumerate(prompts))
