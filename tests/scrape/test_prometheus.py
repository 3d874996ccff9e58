from __future__ import annotations

import math
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from picker.bench.scrape_parse import vllm_page
from picker.scrape.prometheus import ExpositionError, Sample, Selector, pick_largest_value, pick_latest, scan


def one(page: bytes, name: str) -> Sample:
    samples = scan(page, [name])[name]
    assert len(samples) == 1, samples
    return samples[0]


def test_reads_only_the_wanted_names_and_keeps_page_order() -> None:
    page = b'a 1\nb{x="1"} 2\na{y="2"} 3\nc 4\n'
    found = scan(page, ["a", "c", "absent"])
    assert [s.value for s in found["a"]] == [1.0, 3.0]
    assert found["a"][1].labels == {"y": "2"}
    assert [s.value for s in found["c"]] == [4.0]
    assert found["absent"] == []
    assert "b" not in found


def test_names_sharing_a_prefix_are_not_confused() -> None:
    page = b'x_bucket{le="1"} 5\nx_count 5\nx 7\nxx 9\n'
    assert one(page, "x").value == 7.0
    assert one(page, "x_count").value == 5.0


def test_comments_mentioning_the_name_are_skipped() -> None:
    page = b"# HELP m the m metric: m 42\n# TYPE m gauge\n#m 41\nm 1\n"
    assert one(page, "m").value == 1.0


def test_label_values_with_escapes_commas_and_braces() -> None:
    page = b'm{a="say \\"hi\\", ok",b="}{,=",c="back\\\\slash",d="line\\nbreak"} 1\n'
    assert one(page, "m").labels == {"a": 'say "hi", ok', "b": "}{,=", "c": "back\\slash", "d": "line\nbreak"}


def test_a_wanted_name_inside_another_series_label_value_is_not_a_match() -> None:
    page = b'other{help="m 5"} 1\nother{x="\\nm 6"} 2\n'
    assert scan(page, ["m"])["m"] == []


def test_metric_without_labels_empty_braces_and_trailing_comma() -> None:
    page = b'm 1\nm{} 2\nm{a="x",} 3\nm { a = "y" , } 4\n'
    found = scan(page, ["m"])["m"]
    assert [s.value for s in found] == [1.0, 2.0, 3.0, 4.0]
    assert [s.labels for s in found] == [{}, {}, {"a": "x"}, {"a": "y"}]


def test_timestamps_special_values_blanks_and_crlf() -> None:
    page = b'm{a="1"} NaN 1700000000000\r\n\tm{a="2"}\t+Inf\r\nm{a="3"} -Inf -5\nm{a="4"} 1.5e-3'
    found = scan(page, ["m"])["m"]
    assert math.isnan(found[0].value)
    assert found[0].timestamp_ms == 1_700_000_000_000
    assert (found[1].value, found[1].timestamp_ms) == (math.inf, None)
    assert (found[2].value, found[2].timestamp_ms) == (-math.inf, -5)
    assert found[3].value == 0.0015  # last line without a newline


def test_names_with_colons_and_the_first_line() -> None:
    page = b'vllm:num_requests_waiting{model_name="m"} 3\nvllm:num_requests_running 2\n'
    assert one(page, "vllm:num_requests_waiting").value == 3.0
    assert one(page, "vllm:num_requests_running").value == 2.0


def test_utf8_label_values() -> None:
    assert one('m{model="modèle-日本"} 1\n'.encode(), "m").labels == {"model": "modèle-日本"}


@pytest.mark.parametrize(
    "line",
    [
        b"m\n",  # no value
        b'm{a="1"}\n',
        b"m{a=1} 2\n",  # unquoted label value
        b'm{a="1" b="2"} 2\n',  # missing comma
        b'm{a="1"',  # unterminated
        b'm{a="1"} two\n',
        b"m 1 2 3\n",
        b"m 1 1.5\n",  # timestamps are integers
        b"m{,} 1\n",
    ],
)
def test_malformed_wanted_lines_raise(line: bytes) -> None:
    with pytest.raises(ExpositionError, match="m"):
        scan(b"ok 1\n" + line, ["m"])


def test_malformed_unwanted_lines_are_ignored() -> None:
    page = b"junk{{{ not a metric\nother{a=1} x\nm 4\n"
    assert one(page, "m").value == 4.0


def test_selector_parse_and_match() -> None:
    sel = Selector.parse('nv_trt_llm_request_metrics{request_type=waiting, model="tensorrt_llm"}')
    assert sel.name == "nv_trt_llm_request_metrics"
    assert sel.matchers == (("request_type", "waiting"), ("model", "tensorrt_llm"))
    assert sel.matches({"request_type": "waiting", "model": "tensorrt_llm", "version": "1"})
    assert not sel.matches({"request_type": "scheduled", "model": "tensorrt_llm"})
    assert Selector.parse("vllm:num_requests_waiting") == Selector("vllm:num_requests_waiting")
    assert str(sel) == 'nv_trt_llm_request_metrics{request_type="waiting",model="tensorrt_llm"}'


@pytest.mark.parametrize("spec", ["", "9bad", "m{a!=b}", "m{a=~b}", "m{a=b", "m{=b}"])
def test_selector_rejects_what_it_cannot_do(spec: str) -> None:
    with pytest.raises(ValueError, match=r"selector|metric name"):
        Selector.parse(spec)


def test_series_choice_largest_timestamp_else_first() -> None:
    sel = Selector("m")
    plain = [Sample("m", {"i": "1"}, 1.0), Sample("m", {"i": "2"}, 2.0)]
    assert pick_latest(plain, sel) == plain[0]
    stamped = [*plain, Sample("m", {"i": "3"}, 3.0, 10), Sample("m", {"i": "4"}, 4.0, 30), Sample("m", {}, 5.0, 20)]
    assert pick_latest(stamped, sel) == stamped[3]
    assert pick_latest(stamped, Selector("m", (("i", "2"),))) == plain[1]
    assert pick_latest(stamped, Selector("m", (("i", "9"),))) is None


def test_largest_value_ignores_nan() -> None:
    samples = [Sample("m", {}, math.nan), Sample("m", {"a": "1"}, 5.0), Sample("m", {"a": "2"}, 7.0)]
    best = pick_largest_value(samples, Selector("m"))
    assert best is not None
    assert best.labels == {"a": "2"}
    assert pick_largest_value([Sample("m", {}, math.nan)], Selector("m")) is None


def _reference(page: bytes, names: set[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {n: [] for n in names}
    for family in text_string_to_metric_families(page.decode()):
        for s in family.samples:
            if s.name in names:
                out[s.name].append((dict(s.labels), s.value))
    return out


def _ours(page: bytes, names: set[str]) -> dict[str, list[tuple[dict[str, str], float]]]:
    return {n: [(dict(s.labels), s.value) for s in samples] for n, samples in scan(page, names).items()}


def test_agrees_with_prometheus_client_on_a_generated_vllm_page() -> None:
    page = vllm_page(["model-a", "model-b", "model-c"])
    names = {
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:lora_requests_info",
        "vllm:cache_config_info",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:prompt_tokens_total",
        "python_gc_objects_collected_total",
        "http_request_duration_seconds_sum",
    }
    ours = _ours(page, names)
    assert ours == _reference(page, names)
    assert len(ours["vllm:time_to_first_token_seconds_bucket"]) == 3 * 23


_label_values = st.text(alphabet=string.ascii_letters + string.digits + ' ,{}="\\\n=é:', max_size=12)
_series = st.lists(
    st.tuples(
        st.sampled_from(["m", "m_total", "n:x", "m2"]),
        st.dictionaries(st.sampled_from(["a", "b", "le", "model_name"]), _label_values, max_size=3),
        st.floats(allow_nan=False, width=32),
    ),
    max_size=12,
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@settings(max_examples=60, deadline=None)
@given(_series)
def test_agrees_with_prometheus_client_on_random_series(series: list[tuple[str, dict[str, str], float]]) -> None:
    lines = ["# HELP m a help text that mentions m 1", "# TYPE m gauge"]
    for name, labels, value in series:
        body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{body}}} {value!r}" if labels else f"{name} {value!r}")
    page = ("\n".join(lines) + "\n").encode()
    names = {"m", "n:x"}
    assert _ours(page, names) == _reference(page, names)
