"""The real control plane, started once for the tests of this folder (marked ``kube``) and stopped after them.

Package scope, not session: its processes are children of pytest, and later tests (tests/test_serve.py) count
pytest's children as picker workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from picker.bench.cluster import ControlPlane, running_control_plane


@pytest.fixture(scope="package")
def control_plane() -> Iterator[ControlPlane]:
    with running_control_plane() as cp:
        yield cp


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cluster/" in str(item.path):
            item.add_marker(pytest.mark.kube)
