"""The commands' flags: one parser for the comma lists, a range for each number; a bad value is a usage error
naming the flag (exit 2), not a traceback from inside a run."""

from __future__ import annotations

import re

import pytest

from picker import cli
from picker.bench import flags


def test_names_strip_and_drop_empty_items() -> None:
    assert flags.names(" rr, picker ,,lc,") == ["rr", "picker", "lc"]
    assert flags.names("") == []


def test_numbers_in_order_of_the_kind_given() -> None:
    assert flags.numbers("20, 40,5", "--rates", float) == [20.0, 40.0, 5.0]
    ints = flags.numbers("16,256", "--endpoints", int)
    assert ints == [16, 256]
    assert all(type(v) is int for v in ints)


def test_ranges_expand_in_place() -> None:
    assert flags.numbers("7,0-2,9", "--seeds", int, ranges=True) == [7, 0, 1, 2, 9]
    with pytest.raises(TypeError):
        flags.numbers("1", "--x", float, ranges=True)


@pytest.mark.parametrize(
    ("text", "options", "says"),
    [
        ("5,x", {}, "a comma list of numbers"),
        ("", {}, "at least one"),
        (" , ", {}, "at least one"),
        ("nan", {}, "a comma list of numbers"),
        ("inf", {}, "a comma list of numbers"),
        ("0,3", {"above": 0}, "each above 0"),
        ("-1", {"least": 0}, "each at least 0"),
        ("1.5", {"kind": int}, "a comma list of integers"),
        ("3-1", {"kind": int, "ranges": True}, "or ranges (0-9)"),
        ("1-x", {"kind": int, "ranges": True}, "or ranges (0-9)"),
        ("0-2,1", {"kind": int, "ranges": True, "distinct": True}, "none twice"),
        ("1-2", {"kind": int}, "a comma list of integers"),  # a range where none are taken
    ],
)
def test_bad_values_name_the_flag_and_the_value(text: str, options: dict[str, object], says: str) -> None:
    kind = options.pop("kind", float)
    with pytest.raises(ValueError, match=f"^--flag {re.escape(repr(text))}: ") as caught:
        flags.numbers(text, "--flag", kind, **options)  # type: ignore[call-overload]
    assert says in str(caught.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "overhead", "--endpoints", "16,x"],
        ["bench", "overhead", "--sizes", "0"],
        ["bench", "overhead", "--workers", ""],
        ["bench", "overhead", "--fronts", "native,h2"],
        ["bench", "schedule", "--endpoints", "4,x"],
        ["bench", "schedule", "--sizes", "-1"],
        ["bench", "lab", "--rates", "5,x"],
        ["bench", "lab-eval", "--rates", "x"],
        ["bench", "lab-eval", "--seeds", "2-1"],
        ["bench", "lab-ha", "--delays-ms", "a"],
        ["bench", "lab-ha", "--replicas", "1"],
        ["bench", "lab-pd", "--rates", "-1"],
        ["bench", "kv-lab", "--ratios", "x"],
        ["bench", "kv-live", "--replicas", "0"],
        ["bench", "scrape-parse", "--models", "1,y"],
        ["load", "--url", "http://127.0.0.1:9", "--rate", "1,x"],
        ["load", "--url", "http://127.0.0.1:9", "--concurrency", "0"],
        ["load", "--url", "http://127.0.0.1:9", "--lora", "a,b", "--lora-weights", "1,x"],
    ],
)
def test_each_command_refuses_a_bad_list_by_name(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    flag = next(a for a in argv if a.startswith("--") and a != "--url")
    flag = "--lora-weights" if "--lora-weights" in argv else flag
    assert flag in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--max-body-bytes=-1"],
        ["serve", "--retry-after=-1"],
        ["sim", "--startup-s=-1"],
        ["sim", "--duration-s=-1"],
        ["sim", "--event-batch-size=0"],
        ["demo", "--system-len=0"],
        ["load", "--url", "http://127.0.0.1:9", "--long-fraction", "1.5"],
        ["bench", "overhead", "--latency-requests=1"],
        ["bench", "schedule", "--cycles=0"],
        ["bench", "schedule", "--prefilter=-1"],
        ["bench", "kv-index", "--endpoints=0"],
        ["bench", "kv-lab", "--external-share=2"],
        ["bench", "kv-live", "--rate=0"],
        ["bench", "gateways", "--duration=0"],
        ["bench", "lab", "--turns=0"],
        ["bench", "soak", "--pods=1"],
        ["bench", "lab-ha", "--loss=-0.5"],
    ],
)
def test_a_number_out_of_range_is_refused_before_anything_runs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    flag = next(a for a in argv if a.startswith("--") and a != "--url").split("=")[0]
    assert f"argument {flag}: " in capsys.readouterr().err
