"""TokenEstimator: the parser's count until calibrated, then characters / learned characters-per-token."""

from __future__ import annotations

import pytest

from picker.scheduling.tokens import TokenEstimator
from tests.conftest import request


def test_uncalibrated_uses_the_parsers_count() -> None:
    est = TokenEstimator()
    assert est.prompt_tokens(request(prompt="x" * 40)) == 10.0
    assert est.prompt_tokens(request(prompt="x" * 40, prompt_tokens=7)) == 7.0  # e.g. token-id prompts
    assert est.prompt_tokens(request(prompt="", prompt_tokens=5)) == 5.0
    assert est.prompt_tokens(request(prompt="x" * 40, prompt_tokens=0)) == 10.0


def test_first_sample_sets_then_moving_average() -> None:
    est = TokenEstimator()
    req = request(prompt="x" * 300)
    est.observe(req, 100)  # 3 chars per token
    assert est.chars_per_token("my-model") == 3.0
    assert est.prompt_tokens(req) == 100.0
    est.observe(req, 50)  # 6 chars per token: moves 5 % of the way
    assert est.chars_per_token("my-model") == pytest.approx(3.15)
    assert est.chars_per_token("other-model") == 4.0


def test_ignores_useless_samples_and_clamps() -> None:
    est = TokenEstimator()
    est.observe(request(prompt="x" * 10), None)
    est.observe(request(prompt="x" * 10), 0)
    est.observe(request(prompt=""), 10)
    assert est.chars_per_token("my-model") == 4.0
    est.observe(request(prompt="x" * 1000), 1)
    assert est.chars_per_token("my-model") == 16.0
    off = TokenEstimator(calibrate=False)
    off.observe(request(prompt="x" * 300), 100)
    assert off.chars_per_token("my-model") == 4.0
