"""A start against its namespace's rules: one read of the namespace gives both its
policy level and its default limits, read again for every start."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.agent.rules import NamespaceRules, StartFailed
from sandlot.agent.settings import AgentSettings
from sandlot.api.keys import DEFAULT_LIMITS_ANNOTATION, LEVEL_LABEL
from sandlot.api.reasons import SandboxReason
from tests.support.clock import FakeClock
from tests.support.fakeobjects import FakeObjects


class Namespaces:
    """Namespaces by name as (labels, annotations), counting the reads."""

    def __init__(self, **namespaces: tuple[dict[str, str], dict[str, str]]) -> None:
        self.namespaces = namespaces
        self.reads: list[str] = []

    def read(self, name: str) -> tuple[dict[str, str], dict[str, str]]:
        self.reads.append(name)
        if name not in self.namespaces:
            raise RuntimeError(f"namespace {name} unreadable")
        return self.namespaces[name]


def rules_over(namespaces: Namespaces) -> NamespaceRules:
    return NamespaceRules(
        AgentSettings(node_name="n"),
        FakeObjects(FakeClock().now),  # type: ignore[arg-type]
        read=namespaces.read,
    )


def sandbox(namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": "sb", "uid": "u-1"},
        "spec": {"image": "docker.io/library/busybox:1.36", "command": ["sleep", "1"], **spec},
    }


def test_a_start_reads_its_namespace_once_for_its_level_and_its_defaults() -> None:
    namespaces = Namespaces(
        team=({LEVEL_LABEL: "baseline"}, {DEFAULT_LIMITS_ANNOTATION: "memory=300Mi,pids=200"})
    )
    rules = rules_over(namespaces)
    started = rules.for_start(sandbox("team"))  # outside restricted: its level is read
    assert started is not None
    spec, pids = started
    assert spec.resources is not None and spec.resources.limits is not None
    assert spec.resources.limits.memory == "300Mi"
    assert pids == 200
    assert namespaces.reads == ["team"]
    rules.for_start(sandbox("team"))  # the next start reads it again: never cached
    assert namespaces.reads == ["team", "team"]


@pytest.mark.parametrize(
    ("labels", "annotations", "spec", "reason"),
    [
        ({LEVEL_LABEL: "baseline"}, {}, {"hostNetwork": True}, SandboxReason.POLICY_VIOLATION),
        (
            {},
            {DEFAULT_LIMITS_ANNOTATION: "memory=lots"},
            {},
            SandboxReason.INVALID_DEFAULT_LIMITS,
        ),
    ],
    ids=["level-from-the-labels", "defaults-from-the-annotations"],
)
def test_the_one_read_refuses_by_its_labels_and_its_annotations(
    labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any], reason: str
) -> None:
    namespaces = Namespaces(team=(labels, annotations))
    with pytest.raises(StartFailed) as caught:
        rules_over(namespaces).for_start(sandbox("team", **spec))
    assert caught.value.reason == reason
    assert namespaces.reads == ["team"]


def test_an_unreadable_namespace_makes_the_start_wait() -> None:
    namespaces = Namespaces()
    assert rules_over(namespaces).for_start(sandbox("gone")) is None
    assert namespaces.reads == ["gone"]
