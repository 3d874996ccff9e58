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
    assert path_us > cycle_us > 0  # the path includes a scheduling cycle, and more
