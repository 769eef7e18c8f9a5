"""Every sandbox gets limits (its own, its namespace's, the agent's), and a node
refuses what does not fit, oldest first."""

from __future__ import annotations

import re

import pytest

from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.capacity import Capacity, Usage, over_capacity, storage_room, usage_of
from sandlot.policy.limits import (
    DefaultLimits,
    LimitRefused,
    ParentLimits,
    check_limits,
    merge,
    parent_limits,
    parse_defaults,
    pids_limit,
    with_defaults,
)

AGENT = DefaultLimits("1Gi", "1", 1024)
GI = 2**30


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("", DefaultLimits()),
        ("memory=512Mi", DefaultLimits(memory="512Mi")),
        ("cpu=500m, pids=256", DefaultLimits(cpu="500m", pids=256)),
        ("pids=64,memory=1.5Gi,cpu=2", DefaultLimits("1.5Gi", "2", 64)),
    ],
    ids=["empty", "memory", "cpu and pids with a space", "all, any order"],
)
def test_parse_namespace_defaults(text: str, parsed: DefaultLimits) -> None:
    assert parse_defaults(text) == parsed


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("memory", "'memory' is not one of"),
        ("disk=1Gi", "'disk=1Gi' is not one of"),
        ("memory=lots", "not a Kubernetes quantity"),
        ("cpu=0", "not a positive quantity"),
        ("pids=many", "not a whole number"),
        ("pids=0", "pids 0 is below the floor of 8"),
        ("memory=1Mi", "memory '1Mi' is below the floor of 4Mi"),
        ("memory=0", "not a positive quantity"),
    ],
    ids=[
        "no value",
        "unknown key",
        "not a quantity",
        "zero",
        "pids not a number",
        "pids 0 is not none",
        "memory below the floor",
        "memory 0 is not none",
    ],
)
def test_bad_namespace_defaults_name_the_part(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_defaults(text)


@pytest.mark.parametrize(
    ("spec_limits", "namespace", "memory", "cpu", "pids"),
    [
        ({}, "", "1Gi", "1", 1024),
        ({}, "memory=256Mi,pids=100", "256Mi", "1", 100),
        ({"memory": "64Mi"}, "memory=256Mi,cpu=2", "64Mi", "2", 1024),
        ({"memory": "64Mi", "cpu": "250m"}, "memory=256Mi,cpu=2", "64Mi", "250m", 1024),
    ],
    ids=["agent defaults", "namespace overrides", "own memory wins", "own limits win"],
)
def test_every_sandbox_gets_limits(
    spec_limits: dict[str, str], namespace: str, memory: str, cpu: str, pids: int
) -> None:
    spec = SandboxSpec.model_validate(
        {"image": "i", "command": ["sh"], "resources": {"limits": spec_limits}}
    )
    defaults = merge(AGENT, parse_defaults(namespace))
    limits = with_defaults(spec, defaults).resources
    assert limits is not None
    assert (limits.limits.memory, limits.limits.cpu) == (memory, cpu)
    assert pids_limit(defaults) == pids


@pytest.mark.parametrize(
    ("spec_limits", "words"),
    [
        ({"memory": "0"}, "spec.resources.limits.memory '0' is below the floor of 4Mi"),
        ({"memory": "0Mi"}, "spec.resources.limits.memory '0Mi' is below the floor of 4Mi"),
        ({"memory": "1"}, "spec.resources.limits.memory '1' is below the floor of 4Mi"),
        ({"memory": "4095Ki"}, "spec.resources.limits.memory '4095Ki'"),
        ({"cpu": "0"}, "spec.resources.limits.cpu '0' is below the floor of 1m"),
    ],
    ids=["memory 0", "memory 0Mi", "memory 1 byte", "memory just under", "cpu 0"],
)
def test_the_agent_refuses_a_limit_written_before_the_rule_naming_the_field(
    spec_limits: dict[str, str], words: str
) -> None:
    # The CRD refuses these now; an object stored before the rule still reaches the agent.
    spec = SandboxSpec.model_validate(
        {"image": "i", "command": ["sh"], "resources": {"limits": spec_limits}}
    )
    filled = with_defaults(spec, AGENT)
    with pytest.raises(LimitRefused, match=re.escape(words)) as refused:
        check_limits(filled, pids_limit(AGENT))
    assert refused.value.reason == SandboxReason.LIMIT_REFUSED


def test_the_floor_itself_is_a_limit() -> None:
    spec = SandboxSpec.model_validate(
        {"image": "i", "command": ["sh"], "resources": {"limits": {"memory": "4Mi", "cpu": "1m"}}}
    )
    check_limits(with_defaults(spec, AGENT), 8)


@pytest.mark.parametrize(
    ("defaults", "words"),
    [
        (DefaultLimits("1Gi", "1", None), "no pids limit"),
        (DefaultLimits("1Gi", "1", 0), "the pids limit 0 is below the floor of 8"),
    ],
    ids=["no pids limit", "pids 0"],
)
def test_there_is_no_sandbox_without_a_pids_limit(defaults: DefaultLimits, words: str) -> None:
    with pytest.raises(LimitRefused, match=words):
        pids_limit(defaults)


def test_a_sandbox_left_without_a_limit_is_refused() -> None:
    spec = SandboxSpec.model_validate({"image": "i", "command": ["sh"]})
    filled = with_defaults(spec, DefaultLimits(cpu="1", pids=64))
    with pytest.raises(LimitRefused, match=r"spec\.resources\.limits\.memory is unset"):
        check_limits(filled, 64)


@pytest.mark.parametrize(
    ("node_memory", "pid_max", "limits"),
    [
        (16 * GI, 32768, ParentLimits(15 * GI, 28672)),
        (GI // 2, 1000, ParentLimits(4 * 2**20, 8)),
    ],
    ids=["the node minus its reserves", "a node with nothing to spare: the floors, never none"],
)
def test_the_parent_of_all_sandboxes_keeps_the_nodes_share(
    node_memory: int, pid_max: int, limits: ParentLimits
) -> None:
    assert parent_limits(node_memory, GI, pid_max, 4096) == limits


def test_a_spec_without_resources_gets_them() -> None:
    spec = SandboxSpec.model_validate({"image": "i", "command": ["sh"]})
    assert spec.resources is None
    filled = with_defaults(spec, AGENT)
    assert filled.resources is not None and filled.resources.limits.memory == "1Gi"
    assert filled.command == ["sh"]


def u(key: str, memory_gi: float, cpu: int = 0, created: str = "", disk_gi: float = 0) -> Usage:
    return Usage(key, int(memory_gi * GI), cpu, created, int(disk_gi * GI))


@pytest.mark.parametrize(
    ("started", "waiting", "capacity", "refused"),
    [
        ([], [u("a", 1)], Capacity(2, 4 * GI, 4000), {}),
        ([u("r", 1), u("s", 1)], [u("a", 1)], Capacity(2), {"a": "2 sandboxes"}),
        ([u("r", 3)], [u("a", 2)], Capacity(10, 4 * GI), {"a": "memory limit 2.00Gi"}),
        ([u("r", 0, 3000)], [u("a", 0, 1500)], Capacity(10, None, 4000), {"a": "CPU limit"}),
        (
            [],
            [u("new", 3, created="2026-01-02"), u("old", 3, created="2026-01-01")],
            Capacity(10, 4 * GI),
            {"new": "memory"},
        ),
        ([], [u("a", 2), u("b", 3), u("c", 1)], Capacity(10, 4 * GI), {"b": "memory"}),
        (
            [u("r", 0, disk_gi=6)],
            [u("a", 0, disk_gi=4), u("b", 0, disk_gi=2)],
            Capacity(10, None, None, 8 * GI),
            {"a": "ephemeral-storage limit 4.00Gi does not fit: 6.00Gi of 8.00Gi"},
        ),
        ([u("r", 0, disk_gi=6)], [u("a", 0)], Capacity(10, None, None, 6 * GI), {}),
        ([u("r", 0, disk_gi=600)], [u("a", 0, disk_gi=4)], Capacity(10), {}),
    ],
    ids=[
        "fits",
        "sandbox count",
        "memory",
        "cpu",
        "oldest first",
        "a smaller later one still fits",
        "ephemeral storage",
        "no disk limit counts nothing",
        "storage not bounded",
    ],
)
def test_over_capacity(
    started: list[Usage], waiting: list[Usage], capacity: Capacity, refused: dict[str, str]
) -> None:
    result = over_capacity("n1", started, waiting, capacity)
    assert set(result) == set(refused)
    for key, words in refused.items():
        assert result[key].startswith("node n1 is full: ") and words in result[key]


def test_usage_of_quantities() -> None:
    assert usage_of("k", "512Ki", "250m") == Usage("k", 512 * 1024, 250)
    assert usage_of("k", "", "") == Usage("k", 0, 0)
    assert usage_of("k", "", "", storage="2Gi").storage == 2 * GI


def test_a_nodes_disk_room_is_below_its_image_gc_high_mark() -> None:
    assert storage_room(100 * GI, 85.0) == 85 * GI
