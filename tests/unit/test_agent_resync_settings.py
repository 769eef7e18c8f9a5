"""The sync's two intervals: the shortest gap between passes and the longest."""

from __future__ import annotations

import pytest

from sandlot.agent.settings import AgentSettings
from sandlot.cli.options import SettingsError, settings_from
from tests.unit.test_agent_settings import _parse


def test_a_pass_runs_at_least_every_30s_and_at_most_every_second_by_default() -> None:
    s = settings_from(AgentSettings, _parse("--node", "n1"), environ={})
    assert s.sync_interval.total_seconds() == 1
    assert s.resync_interval.total_seconds() == 30


def test_resync_interval_comes_from_the_environment() -> None:
    s = settings_from(
        AgentSettings, _parse("--node", "n1"), environ={"SANDLOT_RESYNC_INTERVAL": "2m"}
    )
    assert s.resync_interval.total_seconds() == 120


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--node", "n1", "--resync-interval", "0s"), "--resync-interval .*must be positive"),
        (("--node", "n1", "--sync-interval", "5s", "--resync-interval", "2s"), "resync_interval"),
    ],
    ids=["resync-positive", "resync-not-below-sync"],
)
def test_bad_intervals_are_refused_naming_the_setting(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        settings_from(AgentSettings, _parse(*argv), environ={})
