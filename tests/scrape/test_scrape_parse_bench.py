"""``picker bench scrape-parse`` (picker/bench/scrape_parse.py): the page generator and a tiny run."""

from __future__ import annotations

import argparse

import pytest

from picker.bench import scrape_parse
from picker.scrape import engines


def test_generated_page_is_realistic_and_both_parsers_agree() -> None:
    page = scrape_parse.vllm_page(["meta-llama/Llama-3.1-8B-Instruct"], waiting=5, running=7, kv_usage=0.25)
    assert 40_000 < len(page) < 60_000  # a one-model vLLM page is ~50 KB
    assert page.count(b"_bucket{") > page.count(b"\n") / 2  # mostly histogram buckets
    ours = engines.extract("vllm", page, 0.0)
    assert ours == scrape_parse.reference_extract(page)
    assert (ours.waiting, ours.running, ours.kv_usage) == (5, 7, 0.25)
    assert ours.running_loras == frozenset({"sql-lora", "chat-lora"})
    assert (ours.block_size, ours.num_gpu_blocks) == (16, 27153)


def test_run_prints_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    scrape_parse.configure(parser)
    assert scrape_parse.run(parser.parse_args(["--models", "1,2", "--repeat", "1", "--number", "2"])) == 0
    out = capsys.readouterr().out
    assert "µs/page" in out
    assert "pages/s" in out
    assert out.count("prometheus_client text_string_to_metric_families") == 2


def test_bad_models_argument_fails() -> None:
    parser = argparse.ArgumentParser()
    scrape_parse.configure(parser)
    assert scrape_parse.run(parser.parse_args(["--models", "one"])) == 2
