"""The presets produce the numbers they promise (virtual time, one request on an idle engine)."""

from __future__ import annotations

import pytest

from picker.sim.config import PRESETS, preset
from picker.sim.engine import Engine, RequestState, SimRequest
from picker.sim.tokenizer import default_tokenizer
from picker.sim.virtual import run_virtual

WORDS = default_tokenizer().word_ids


def single(name: str, n_prompt: int, n_out: int) -> RequestState:
    engine = Engine(preset(name))
    ids = [WORDS[i % len(WORDS)] for i in range(n_prompt)]
    [state] = run_virtual(engine, [(0.0, SimRequest("r", ids, max_tokens=n_out, ignore_eos=True))])
    assert isinstance(state, RequestState)
    return state


def e2e(s: RequestState) -> float:
    assert s.finished_s is not None
    return s.finished_s - s.arrival_s


def test_h100_8b_matches_the_reference_profile() -> None:
    s = single("h100-8b", 256, 101)
    assert s.ttft_s is not None
    assert 0.060 <= s.ttft_s <= 0.120
    itl = (e2e(s) - s.ttft_s) / 100
    assert 0.010 <= itl <= 0.015


def test_cpu_matches_the_seed_measurements() -> None:
    assert e2e(single("cpu", 13, 4)) == pytest.approx(0.21, abs=0.01)
    assert e2e(single("cpu", 13, 512)) == pytest.approx(15.6, abs=0.2)


def test_fast_is_fast() -> None:
    assert e2e(single("fast", 100, 32)) < 0.1


def test_preset_overrides_and_unknown_name() -> None:
    assert preset("fast", num_gpu_blocks=7).num_gpu_blocks == 7
    assert PRESETS["fast"].num_gpu_blocks != 7
    with pytest.raises(ValueError, match="unknown preset"):
        preset("nope")
    with pytest.raises(ValueError, match="max_num_seqs"):
        preset("fast", max_num_seqs=0)
