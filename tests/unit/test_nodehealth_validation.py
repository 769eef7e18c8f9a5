"""The node-health settings and inputs refuse bad values."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from sandlot.api.node import ObservedRenewal
from sandlot.policy.nodehealth import (
    NodeHealthSettings,
    decide,
)
from tests.support.nodehealth import (
    CALM,
    CREATED,
    FRESH,
    GUARD,
    NOW,
    SETTINGS,
    UNTRACKED,
    node,
    s,
)


@pytest.mark.parametrize(
    ("kwargs", "field_name"),
    [
        ({"grace_period": 0}, "grace_period"),
        ({"grace_period": -5}, "grace_period"),
        ({"drain_timeout": 0}, "drain_timeout"),
        ({"grace": 300}, "grace"),
    ],
    ids=[
        "refuses_a_zero_grace_period",
        "refuses_a_negative_grace_period",
        "refuses_a_zero_drain_timeout",
        "refuses_an_unknown_setting",
    ],
)
def test_settings_refuse_bad_values_naming_the_field(
    kwargs: dict[str, int], field_name: str
) -> None:
    with pytest.raises(ValidationError, match=field_name):
        NodeHealthSettings(**kwargs)  # type: ignore[arg-type]


def test_settings_defaults_match_the_spec() -> None:
    assert SETTINGS.grace_period == s(300)
    assert SETTINGS.drain_timeout == timedelta(minutes=10)
    assert NodeHealthSettings(grace_period=30).grace_period == s(30)  # type: ignore[arg-type]


def test_decide_refuses_a_naive_now() -> None:
    with pytest.raises(ValueError, match="now must be timezone-aware"):
        decide(node(), FRESH, UNTRACKED, NOW.replace(tzinfo=None), CALM, GUARD)


@pytest.mark.parametrize(
    "build",
    [
        lambda: ObservedRenewal(observed_at=NOW.replace(tzinfo=None), lease_duration_seconds=60),
        lambda: ObservedRenewal(observed_at=NOW, lease_duration_seconds=-1),
        lambda: node(first_seen=CREATED.replace(tzinfo=None)),
    ],
    ids=[
        "renewal_refuses_a_naive_observed_at",
        "renewal_refuses_a_negative_duration",
        "node_refuses_a_naive_first_seen",
    ],
)
def test_inputs_refuse_bad_values(build) -> None:
    with pytest.raises(ValueError):
        build()
