"""User plugins by module path and by entry point; startup errors for every way a plugin can be wrong."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from picker import errors
from picker.plugins import Category
from picker.scheduling import external
from picker.scheduling.config import load_config
from picker.scheduling.isolation import GuardedFilter, GuardedPicker, GuardedScorer
from picker.scheduling.scheduler import Scheduler
from tests.conftest import endpoint, request
from tests.plugins import samples
from tests.scheduling.helpers import HEAD, ctx, ids

SAMPLES = "tests.plugins.samples"


def one_plugin(type_name: str, parameters: str = "", extra: str = "") -> str:
    params = f"\n  parameters: {parameters}" if parameters else ""
    return HEAD + f"plugins:\n- name: mine\n  type: {type_name}{params}\n{extra}"


def config_error(text: str) -> str:
    with pytest.raises(errors.ConfigError) as info:
        load_config(text, ctx())
    return str(info.value)


# -- by module path ----------------------------------------------------------------------------------------


def test_scorer_by_path_routes_and_is_explained() -> None:
    c = ctx()
    config = load_config(one_plugin(f"{SAMPLES}:TenantScorer", "{headerName: x-team, label: team}"), c)
    plugin = config.plugins["mine"]
    assert isinstance(plugin, GuardedScorer)
    assert isinstance(plugin.plugin, samples.TenantScorer)
    assert plugin.plugin.params == samples.TenantParams(header_name="x-team", label="team")
    assert plugin.plugin.name == "mine"
    assert (plugin.type, plugin.name, plugin.category) == (f"{SAMPLES}:TenantScorer", "mine", Category.AFFINITY)

    eps = [endpoint(1, labels={"team": "a"}), endpoint(2, labels={"team": "b"}), endpoint(3, labels={"team": "c"})]
    result = Scheduler(config, c).schedule(request(headers={"x-team": "b"}), eps)
    assert ids(result.targets) == [2]
    (profile,) = result.explain()["profiles"]
    assert profile["scores"]["mine"] == {eps[0].key: 0.0, eps[1].key: 1.0, eps[2].key: 0.0}
    assert "dropped" not in profile
    assert ("Scorer", f"{SAMPLES}:TenantScorer", "mine") in {t[:3] for t in result.plugin_timings}


def test_sequence_result_and_pydantic_params_with_builtins() -> None:
    text = (
        HEAD
        + f"""\
plugins:
- type: queue-scorer
- name: fav
  type: {SAMPLES}:FavouriteScorer
  parameters: {{key: "192.168.1.3:8000", score: 0.4}}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: fav
    weight: 3
"""
    )
    c = ctx()
    eps = [endpoint(1, waiting=0), endpoint(2, waiting=5), endpoint(3, waiting=10)]
    result = Scheduler(load_config(text, c), c).schedule(request(), eps)
    run = result.runs[0]
    assert run.scores["fav"] == {eps[0].key: 0.0, eps[1].key: 0.0, eps[2].key: 0.4}
    assert run.totals[eps[2].key] == pytest.approx(0.0 + 3 * 0.4)
    assert ids(result.targets) == [3]  # 1.2 beats queue-scorer's 1.0 for endpoint 1


def test_filter_and_picker_by_path() -> None:
    text = (
        HEAD
        + f"""\
plugins:
- {{name: odd, type: "{SAMPLES}:OddFilter"}}
- {{name: low, type: "{SAMPLES}:LowestPicker"}}
- type: queue-scorer
"""
    )
    c = ctx()
    config = load_config(text, c)
    assert isinstance(config.plugins["odd"], GuardedFilter)
    assert isinstance(config.plugins["low"], GuardedPicker)
    eps = [endpoint(1, waiting=9), endpoint(2, waiting=0), endpoint(3, waiting=5), endpoint(4, waiting=1)]
    result = Scheduler(config, c).schedule(request(), eps)
    assert result.runs[0].candidates == (eps[0].key, eps[2].key)  # the filter kept positions 0 and 2
    assert ids(result.targets) == [1]  # the lowest queue-scorer total among them: the longest queue


def test_constructor_gets_only_what_it_asks_for() -> None:
    c = ctx()
    config = load_config(one_plugin(f"{SAMPLES}:KwargsScorer", "{label: zone}"), c)
    kwargs = config.plugins["mine"].plugin.kwargs  # type: ignore[attr-defined]
    assert set(kwargs) == {"name", "params", "ctx"}
    assert kwargs["params"] == samples.TenantParams(label="zone")
    assert kwargs["ctx"] is c
    slow = load_config(one_plugin(f"{SAMPLES}:SlowScorer"), c).plugins["mine"].plugin  # type: ignore[attr-defined]
    assert slow.params == samples.SlowParams()


def test_unknown_parameter_keys_are_logged_and_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        config = load_config(one_plugin(f"{SAMPLES}:TenantScorer", "{label: team, colour: blue}"), ctx())
    assert config.plugins["mine"].plugin.params.label == "team"  # type: ignore[attr-defined]
    assert "ignoring unknown parameters: colour" in caplog.text


def test_budget_and_isolation_settings() -> None:
    text = one_plugin(
        f"{SAMPLES}:FlakyScorer",
        extra="  budgetMs: 2.5\npluginIsolation: {budgetMs: 7, disableAfterOverruns: 0, cooldownMs: 1500}\n",
    )
    config = load_config(text, ctx())
    assert (config.isolation.budget_s, config.isolation.disable_after_overruns) == (0.007, 0)
    assert config.isolation.cooldown_s == pytest.approx(1.5)
    assert config.plugins["mine"].guard.budget_s == pytest.approx(0.0025)  # type: ignore[attr-defined]
    default = load_config(one_plugin(f"{SAMPLES}:FlakyScorer"), ctx())
    assert default.plugins["mine"].guard.budget_s == pytest.approx(0.005)  # type: ignore[attr-defined]


def test_budget_on_a_builtin_is_ignored_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        config = load_config(HEAD + "plugins:\n- type: queue-scorer\n  budgetMs: 1\n", ctx())
    assert not isinstance(config.plugins["queue-scorer"], GuardedScorer)
    assert "budgetMs applies to user plugins only" in caplog.text


@pytest.mark.parametrize("bad", ["{budgetMs: 0}", "{disableAfterOverruns: -1}", "{cooldownMs: soon}"])
def test_bad_isolation_settings(bad: str) -> None:
    assert "pluginIsolation" in config_error(one_plugin(f"{SAMPLES}:FlakyScorer", extra=f"pluginIsolation: {bad}\n"))


# -- by entry point (a real distribution's metadata on sys.path) -------------------------------------------


def _dist(root: Path, name: str, entry_points: str) -> None:
    info = root / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[picker.plugins]\n" + textwrap.dedent(entry_points))


def test_entry_point_name_loads_the_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dist(tmp_path, "team-plugins", f"team-scorer = {SAMPLES}:TenantScorer\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "team-scorer" in external.installed_types()
    c = ctx()
    config = load_config(HEAD + "plugins:\n- type: team-scorer\n  parameters: {label: team}\n", c)
    plugin = config.plugins["team-scorer"]
    assert isinstance(plugin, GuardedScorer)
    assert plugin.type == "team-scorer"
    eps = [endpoint(1, labels={"team": "x"}), endpoint(2, labels={"team": "y"})]
    assert ids(Scheduler(config, c).schedule(request(headers={"x-tenant": "y"}), eps).targets) == [2]


def test_entry_point_registered_twice_differently_is_ambiguous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dist(tmp_path / "a", "plugins-a", f"dup-scorer = {SAMPLES}:TenantScorer\n")
    _dist(tmp_path / "b", "plugins-b", f"dup-scorer = {SAMPLES}:FlakyScorer\n")
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    message = config_error(HEAD + "plugins:\n- type: dup-scorer\n")
    assert "several installed distributions register 'dup-scorer'" in message
    assert "plugins-a" in message
    assert "plugins-b" in message


def test_entry_point_that_fails_to_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dist(tmp_path, "broken-plugins", f"gone-scorer = {SAMPLES}:Missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = config_error(HEAD + "plugins:\n- type: gone-scorer\n")
    assert "loading entry point gone-scorer" in message
    assert "broken-plugins 1.0" in message


def test_builtin_names_win_over_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dist(tmp_path, "shadow-plugins", f"queue-scorer = {SAMPLES}:FlakyScorer\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(HEAD + "plugins:\n- type: queue-scorer\n", ctx())
    assert not isinstance(config.plugins["queue-scorer"], GuardedScorer)


def test_unknown_type_lists_builtins_and_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _dist(tmp_path, "listed-plugins", f"listed-scorer = {SAMPLES}:TenantScorer\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = config_error(HEAD + "plugins:\n- type: no-such-scorer\n")
    assert "unknown plugin type 'no-such-scorer'" in message
    assert "queue-scorer" in message
    assert "installed plugin types: listed-scorer" in message
    assert "'package.module:ClassName'" in message


# -- startup errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("type_name", "parameters", "expected"),
    [
        ("no_such_pkg.scorers:Thing", "", "cannot import module 'no_such_pkg.scorers': no module named 'no_such_pkg'"),
        (f"{SAMPLES}:Missing", "", f"module '{SAMPLES}' has no attribute 'Missing'"),
        (f"{SAMPLES}:", "", "a plugin path is 'package.module:ClassName'"),
        (f"{SAMPLES}:not_a_class", "", "is a function, not a class"),
        (f"{SAMPLES}:NoRole", "", "class NoRole has no plugin method; define one of: score(req, endpoints, cycle)"),
        (f"{SAMPLES}:Handler", "", "profile handlers can't be user plugins"),
        (f"{SAMPLES}:TwoRoles", "", "defines score() and filter(); a plugin has exactly one role"),
        (f"{SAMPLES}:ShortScore", "", "can't be called as score(req, endpoints, cycle) (a Scorer)"),
        (f"{SAMPLES}:NeedsSize", "", "requires 'size'; a plugin's constructor may take only the keywords name"),
        (f"{SAMPLES}:IntParams", "", "it must be a pydantic BaseModel or a dataclass"),
        (f"{SAMPLES}:UnannotatedParams", "", "takes params without a type"),
        (f"{SAMPLES}:StringCategory", "", "use picker.plugins.Category"),
        (f"{SAMPLES}:RaisesInInit", "", "creating RaisesInInit raised RuntimeError: no GPU here"),
        (f"{SAMPLES}:FavouriteScorer", "", "invalid parameters: key: Field required"),
        (f"{SAMPLES}:FavouriteScorer", "{key: a, score: high}", "invalid parameters: score: Input should be a valid"),
        (f"{SAMPLES}:SlowScorer", "{costMs: [1]}", "invalid parameters: cost_ms: Input should be a valid number"),
    ],
)
def test_startup_errors_are_readable(type_name: str, parameters: str, expected: str) -> None:
    message = config_error(one_plugin(f'"{type_name}"', parameters))
    assert message.startswith(f"config text: plugin 'mine' (type '{type_name}'): ")
    assert expected in message


def test_a_missing_dependency_of_the_module_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "needs_numpyish.py").write_text("import numpyish_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = config_error(one_plugin("needs_numpyish:Scorer"))
    assert "importing module 'needs_numpyish' failed: No module named 'numpyish_not_installed'" in message


def test_a_module_that_raises_on_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "explodes_on_import.py").write_text("raise ValueError('bad config constant')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    message = config_error(one_plugin("explodes_on_import:Scorer"))
    assert "importing module 'explodes_on_import' raised ValueError: bad config constant" in message
