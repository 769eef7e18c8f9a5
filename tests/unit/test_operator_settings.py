"""The operator's settings nest node health's and the guard's own models (their
fields, defaults and bounds stated once, in ``policy``) while every setting keeps
its flat flag and environment variable."""

from __future__ import annotations

import argparse
from datetime import timedelta

import pytest
from pydantic import BaseModel, ValidationError

from sandlot.api.settings import setting_fields
from sandlot.cli.options import SettingsError, env_name, settings_from
from sandlot.controllers.settings import OperatorSettings
from sandlot.policy.disruption import GuardSettings
from sandlot.policy.nodehealth import NodeHealthSettings

NESTED: dict[str, tuple[type[BaseModel], str]] = {
    "grace_period": (NodeHealthSettings, "grace_period"),
    "drain_timeout": (NodeHealthSettings, "drain_timeout"),
    "agent_lease_duration": (NodeHealthSettings, "unseen_lease_duration"),
    "disruption_threshold": (GuardSettings, "disruption_threshold"),
    "min_nodes_for_guard": (GuardSettings, "min_nodes"),
    "guard_window": (GuardSettings, "window"),
}


def test_the_defaults_are_the_policies_own():
    settings = OperatorSettings()
    assert settings.node_health == NodeHealthSettings()
    assert settings.guard == GuardSettings()


@pytest.mark.parametrize("flat", sorted(NESTED), ids=sorted(NESTED))
def test_each_nested_setting_is_stated_once_in_its_policy(flat: str):
    model, inner = NESTED[flat]
    assert flat not in OperatorSettings.model_fields, f"{flat} repeated in the operator's model"
    assert setting_fields(OperatorSettings)[flat] is model.model_fields[inner]


def test_the_flat_variables_reach_the_nested_models():
    environ = {
        "SANDLOT_GRACE_PERIOD": "45s",
        "SANDLOT_DRAIN_TIMEOUT": "2m",
        "SANDLOT_AGENT_LEASE_DURATION": "30s",
        "SANDLOT_DISRUPTION_THRESHOLD": "0.4",
        "SANDLOT_MIN_NODES_FOR_GUARD": "5",
        "SANDLOT_GUARD_WINDOW": "1m",
    }
    settings = settings_from(OperatorSettings, argparse.Namespace(), environ=environ)
    assert settings.node_health == NodeHealthSettings(
        grace_period=timedelta(seconds=45),
        drain_timeout=timedelta(minutes=2),
        unseen_lease_duration=timedelta(seconds=30),
    )
    assert settings.guard == GuardSettings(
        disruption_threshold=0.4, min_nodes=5, window=timedelta(minutes=1)
    )


def test_a_flag_wins_over_the_variable_for_a_nested_setting():
    args = argparse.Namespace(grace_period="10s")
    settings = settings_from(OperatorSettings, args, environ={"SANDLOT_GRACE_PERIOD": "45s"})
    assert settings.node_health.grace_period == timedelta(seconds=10)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SANDLOT_DISRUPTION_THRESHOLD", "1.5"),
        ("SANDLOT_GRACE_PERIOD", "soon"),
        ("SANDLOT_MIN_NODES_FOR_GUARD", "0"),
        ("SANDLOT_GUARD_WINDOW", "0s"),
    ],
    ids=["threshold-over-one", "grace-not-a-duration", "no-nodes", "empty-window"],
)
def test_a_bad_nested_value_is_refused_naming_its_flat_flag_and_variable(variable, value):
    flat = variable.removeprefix("SANDLOT_").lower()
    with pytest.raises(SettingsError) as refused:
        settings_from(OperatorSettings, argparse.Namespace(), environ={variable: value})
    flag = "--" + flat.replace("_", "-")
    assert f"{flag} / {env_name(flat)}" in str(refused.value)


def test_a_setting_given_flat_and_nested_is_refused():
    with pytest.raises(ValidationError, match="give grace_period or node_health, not both"):
        OperatorSettings(grace_period="10s", node_health=NodeHealthSettings())  # type: ignore[call-arg]
