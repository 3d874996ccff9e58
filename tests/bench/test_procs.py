"""procs.Child.stop: a program with no SIGTERM handler (NGF's shim) stopped by SIGTERM counts as a clean stop."""

from __future__ import annotations

import signal

import pytest

from picker.bench import procs


@pytest.mark.parametrize("dies_on_sigterm", [True, False])
async def test_stop_of_a_program_without_a_sigterm_handler(dies_on_sigterm: bool) -> None:
    async with procs.spawn("sleeper", ["sleep", "30"]) as child:
        child.dies_on_sigterm = dies_on_sigterm
        code = await child.stop(timeout_s=5.0)
    assert code == child.returncode == (0 if dies_on_sigterm else -signal.SIGTERM)


async def test_a_real_failure_is_still_reported() -> None:
    async with procs.spawn("failing", ["sh", "-c", "exit 3"]) as child:
        child.dies_on_sigterm = True
        await child.proc.wait()
        assert await child.stop() == 3
