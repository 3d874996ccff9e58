"""CI-sized run of the coverage-guided fuzzer (fuzz_stream.py): 100 000 inputs, 0 crashes, 0 hung streams.

libFuzzer exits non-zero and prints the failing input on any invariant violation (see fuzz_stream.py); the test
fails with that output. Longer runs: ``.venv/bin/python -m tests.extproc.fuzz_stream -max_total_time=3600``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

RUNS = 100_000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_100k_fuzzed_streams_no_crash_no_hang(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    proc = subprocess.run(
        [
            sys.executable, "-m", "tests.extproc.fuzz_stream",
            f"-runs={RUNS}", "-max_len=2048", "-len_control=0", "-timeout=10", "-rss_limit_mb=1536", "-seed=11",
            f"-artifact_prefix={tmp_path}/", str(corpus),
        ],
        capture_output=True,
        text=True,
        timeout=580,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    done = re.search(r"Done (\d+) runs in (\d+) second", out)
    assert done is not None, out[-3000:]
    assert int(done.group(1)) >= RUNS
    coverage = re.findall(r"cov: (\d+)", out)
    assert coverage, out[-3000:]
    assert int(coverage[-1]) > 300, "the fuzzer reached too little of the code"
    print(f"\natheris: {done.group(1)} runs in {done.group(2)} s, {coverage[-1]} coverage points, 0 crashes")
