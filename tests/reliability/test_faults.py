"""Fault injection over the real Envoy path, CI-sized: each scenario of scenarios.py must meet its goal.

Each prints its row of the docs/reliability.md table (run with ``-s`` to see them); the documented long versions:
``.venv/bin/python -m tests.reliability.report --long``.
"""

from __future__ import annotations

import pytest

from tests.reliability.scenarios import SCENARIOS

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_fault(name: str) -> None:
    row = await SCENARIOS[name](False)
    print("\n" + row.markdown())
    assert row.goal_met, row
