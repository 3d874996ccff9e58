"""The static metrics token: exact bearer match, rotation on file change, closed when the file is bad."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from picker.telemetry.metricsauth import StaticToken, Verdict, bearer_token


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_token(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token


def test_static_token_matches_exactly_and_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("s3cret\n")
    now = [0.0]
    auth = StaticToken(str(path), clock=lambda: now[0])
    assert auth.verdict("Bearer s3cret") is Verdict.ALLOWED
    for wrong in (None, "Bearer s3cre", "Bearer s3cret2", "Bearer S3CRET", "s3cret", "Basic s3cret"):
        assert auth.verdict(wrong) is Verdict.UNAUTHENTICATED

    path.write_text("rotated")
    os.utime(path, ns=(1, 1))
    assert auth.verdict("Bearer s3cret") is Verdict.ALLOWED  # looked at no more than once a second
    now[0] = 1.5
    assert auth.verdict("Bearer rotated") is Verdict.ALLOWED
    assert auth.verdict("Bearer s3cret") is Verdict.UNAUTHENTICATED


def test_an_empty_or_missing_token_file_refuses_everyone(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("  \n")
    now = [0.0]
    auth = StaticToken(str(path), clock=lambda: now[0])
    assert auth.verdict("Bearer ") is Verdict.UNAUTHENTICATED
    assert auth.verdict("Bearer x") is Verdict.UNAUTHENTICATED
    path.write_text("x")
    now[0] = 2.0
    assert auth.verdict("Bearer x") is Verdict.ALLOWED
    path.unlink()
    now[0] = 4.0
    assert auth.verdict("Bearer x") is Verdict.UNAUTHENTICATED
