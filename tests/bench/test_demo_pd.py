"""``picker demo --pd``: its plan and process layout (the live run itself is tests/e2e/test_live_pd.py)."""

from __future__ import annotations

import argparse

import pytest

from picker.bench import demo, demo_pd


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.configure(parser)
    return parser.parse_args(list(argv))


def test_plan_defaults_and_flags() -> None:
    plan = demo_pd.plan_from_args(parse("--pd"))
    assert (plan.fleet, plan.rate, plan.duration_s) == ("2p2d", 2.0, demo_pd.FULL_DURATION_S)
    short = demo_pd.plan_from_args(parse("--pd", "--short", "--rate", "3", "--pd-fleet", "1p3d"))
    assert (short.fleet, short.rate, short.duration_s) == ("1p3d", 3.0, demo_pd.SHORT_DURATION_S)
    assert demo.plan_from_args(parse()).rate == demo.DemoPlan().rate  # the prefix demo keeps its own default


@pytest.mark.parametrize("argv", [("--pd", "--pd-fleet", "4"), ("--pd", "--pd-fleet", "4d")])
def test_bad_plans(argv: tuple[str, ...]) -> None:
    with pytest.raises(ValueError, match=r"fleet"):
        demo_pd.plan_from_args(parse(*argv))


def test_a_rate_not_above_0_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--pd", "--rate", "0")
    assert "argument --rate: '0': above 0" in capsys.readouterr().err


def test_bad_flags_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run(parse("--pd", "--pd-fleet", "x")) == 2
    assert "picker demo --pd" in capsys.readouterr().err


def test_pd_with_the_ngf_gateway_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.run(parse("--pd", "--gateway", "ngf")) == 2
    assert "--pd runs through Envoy only" in capsys.readouterr().err


def test_decode_servers_sit_behind_sidecars_and_roles_split_the_processes() -> None:
    servers = demo_pd._servers(("prefill", "prefill", "decode", "decode"))
    assert [s.name for s in servers] == ["prefill-1", "prefill-2", "decode-1", "decode-2"]
    assert [bool(s.sidecar) for s in servers] == [False, False, True, True]
    assert all(s.endpoint_port == (s.sidecar or s.port) for s in servers)
    groups = [[s.name for s in g] for g in demo_pd._groups(servers)]
    assert groups == [["prefill-1", "prefill-2"], ["decode-1", "decode-2"]]
    plain = demo_pd._servers(("",) * 4)
    assert [s.name for s in plain] == ["server-1", "server-2", "server-3", "server-4"]
    assert [len(g) for g in demo_pd._groups(plain)] == [2, 2]
