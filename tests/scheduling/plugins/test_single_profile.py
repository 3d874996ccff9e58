"""single-profile-handler: runs its one profile once; that profile is primary."""

from __future__ import annotations

from picker.scheduling.framework import CycleState, ProfileResult
from picker.scheduling.plugins import single_profile
from tests.conftest import endpoint, request
from tests.scheduling.helpers import ctx


def test_runs_the_one_profile_once() -> None:
    handler = single_profile.create("h", single_profile.Params(), ctx())
    profiles = {"only": object()}
    assert list(handler.pick_profiles(request(), profiles, {}, CycleState())) == ["only"]
    done = {"only": ProfileResult((endpoint(1),))}
    assert list(handler.pick_profiles(request(), profiles, done, CycleState())) == []
    assert handler.primary(done) == "only"
    assert handler.type == "single-profile-handler"


def test_primary_even_when_the_profile_failed() -> None:
    handler = single_profile.create("h", single_profile.Params(), ctx())
    handler.pick_profiles(request(), {"p": object()}, {}, CycleState())
    assert handler.primary({"p": None}) == "p"
