"""Policy levels as pure rules: what each level refuses, and the messages users read."""

from __future__ import annotations

from typing import Any

import pytest

from sandlot.api.admission import Level, level_of
from sandlot.api.keys import LEVEL_LABEL
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.podsecurity import check, describe


def spec(**fields: Any) -> SandboxSpec:
    return SandboxSpec.model_validate({"image": "img", **fields})


def sc(**fields: Any) -> dict[str, Any]:
    return {"securityContext": fields}


CASES = [
    # (id, level, spec fields, fields refused)
    ("plain sandbox fits baseline", Level.BASELINE, {}, []),
    (
        "privileged refused at baseline",
        Level.BASELINE,
        sc(privileged=True),
        ["spec.securityContext.privileged"],
    ),
    ("privileged false is fine", Level.BASELINE, sc(privileged=False), []),
    (
        "hostNetwork refused at baseline",
        Level.BASELINE,
        {"hostNetwork": True},
        ["spec.hostNetwork"],
    ),
    (
        "baseline caps may be added",
        Level.BASELINE,
        sc(capabilities={"add": ["MKNOD", "CAP_SETFCAP", "audit_write"]}),
        [],
    ),
    (
        "NET_RAW is outside baseline",
        Level.BASELINE,
        sc(capabilities={"add": ["NET_RAW"]}),
        ["spec.securityContext.capabilities.add"],
    ),
    (
        "SYS_ADMIN is outside baseline",
        Level.BASELINE,
        sc(capabilities={"add": ["SYS_ADMIN"]}),
        ["spec.securityContext.capabilities.add"],
    ),
    ("root user fine at baseline", Level.BASELINE, sc(runAsUser=0), []),
    (
        "every breach reported at once",
        Level.BASELINE,
        {"hostNetwork": True, **sc(privileged=True, capabilities={"add": ["ALL"]})},
        [
            "spec.securityContext.privileged",
            "spec.hostNetwork",
            "spec.securityContext.capabilities.add",
        ],
    ),
    (
        "privileged level allows all",
        Level.PRIVILEGED,
        {"hostNetwork": True, **sc(privileged=True, capabilities={"add": ["ALL"]})},
        [],
    ),
    ("restricted needs runAsNonRoot", Level.RESTRICTED, {}, ["spec.securityContext.runAsNonRoot"]),
    ("restricted with runAsNonRoot fits", Level.RESTRICTED, sc(runAsNonRoot=True), []),
    (
        "restricted refuses uid 0",
        Level.RESTRICTED,
        sc(runAsNonRoot=True, runAsUser=0),
        ["spec.securityContext.runAsUser"],
    ),
    (
        "restricted allows NET_BIND_SERVICE only",
        Level.RESTRICTED,
        sc(runAsNonRoot=True, capabilities={"add": ["NET_BIND_SERVICE"]}),
        [],
    ),
    (
        "restricted refuses baseline caps",
        Level.RESTRICTED,
        sc(runAsNonRoot=True, capabilities={"add": ["CHOWN"]}),
        ["spec.securityContext.capabilities.add"],
    ),
    (
        "restricted refuses privileged too",
        Level.RESTRICTED,
        sc(runAsNonRoot=True, privileged=True),
        ["spec.securityContext.privileged"],
    ),
]


@pytest.mark.parametrize(
    ("level", "fields", "refused"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_level_refuses_exactly_these_fields(
    level: Level, fields: dict[str, Any], refused: list[str]
) -> None:
    assert [v.field for v in check(spec(**fields), level, "ns1")] == refused


def test_message_names_field_namespace_level_and_the_label_that_allows_it() -> None:
    (violation,) = check(spec(**sc(privileged=True)), Level.BASELINE, "team-a")
    assert violation.message == (
        "spec.securityContext.privileged is not allowed in namespace team-a (level baseline): "
        f"label the namespace {LEVEL_LABEL}=privileged to allow it"
    )


@pytest.mark.parametrize(
    ("adds", "label"),
    [(["CHOWN"], "baseline"), (["CHOWN", "NET_ADMIN"], "privileged")],
    ids=["baseline caps need only baseline", "any other cap needs privileged"],
)
def test_capability_message_points_at_the_narrowest_level_that_allows_them(
    adds: list[str], label: str
) -> None:
    (violation,) = check(
        spec(**sc(runAsNonRoot=True, capabilities={"add": adds})), Level.RESTRICTED, "n"
    )
    assert f"{', '.join(adds)} not allowed" in violation.message
    assert f"{LEVEL_LABEL}={label} to allow them" in violation.message


def test_describe_joins_every_violation() -> None:
    found = check(spec(hostNetwork=True, **sc(privileged=True)), Level.BASELINE, "n")
    assert describe(found) == "; ".join(v.message for v in found) and len(found) == 2


@pytest.mark.parametrize(
    ("labels", "default", "level"),
    [
        ({}, Level.BASELINE, Level.BASELINE),
        (None, Level.RESTRICTED, Level.RESTRICTED),
        ({LEVEL_LABEL: "privileged"}, Level.BASELINE, Level.PRIVILEGED),
        ({LEVEL_LABEL: "restricted"}, Level.PRIVILEGED, Level.RESTRICTED),
        ({LEVEL_LABEL: "Privileged"}, Level.BASELINE, Level.RESTRICTED),
        ({"other": "privileged"}, Level.BASELINE, Level.BASELINE),
    ],
    ids=[
        "no label: the default",
        "no labels at all: the default",
        "label selects privileged",
        "label wins over the default",
        "a label naming no level is restricted",
        "other labels do not count",
    ],
)
def test_namespace_labels_select_the_level(labels, default, level) -> None:
    assert level_of(labels, default) is level
