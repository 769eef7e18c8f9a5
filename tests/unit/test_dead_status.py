"""The status a Dead marking writes, from plain data: the phase and why, its
``finishedAt`` to the microsecond, and its Ready condition merged into the others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from sandlot.api.timestamps import parse_time, rfc3339
from sandlot.policy.marking import dead_status

NOW = datetime(2030, 1, 1, 12, 0, 0, 250_000, tzinfo=UTC)
EARLIER = "2029-12-31T00:00:00Z"


def running_with(*conditions: dict[str, str]) -> dict[str, object]:
    return {"status": {"phase": "Running", "conditions": list(conditions)}}


def test_a_sandbox_without_conditions_gets_phase_reason_finished_at_and_ready_false() -> None:
    status = dead_status("NodeLost", "node n1 lost", NOW)
    assert {k: v for k, v in status.items() if k != "conditions"} == {
        "phase": "Dead",
        "reason": "NodeLost",
        "message": "node n1 lost",
        "finishedAt": "2030-01-01T12:00:00.250000Z",
    }
    assert status["conditions"] == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "NodeLost",
            "message": "node n1 lost",
            "lastTransitionTime": "2030-01-01T12:00:00.250000Z",
        }
    ]


@pytest.mark.parametrize(
    ("ready_before", "moved"),
    [("True", True), ("False", False)],
    ids=["ready-turns-false-now", "already-false-keeps-its-time"],
)
def test_ready_moves_only_with_its_status_and_every_other_condition_is_kept(
    ready_before: str, moved: bool
) -> None:
    other = {"type": "example.com/Probe", "status": "True", "reason": "Healthy",
             "message": "another controller's", "lastTransitionTime": EARLIER}  # fmt: skip
    ready = {"type": "Ready", "status": ready_before, "reason": "Started",
             "message": "running", "lastTransitionTime": EARLIER}  # fmt: skip
    status = dead_status("NodeDeleted", "gone", NOW, running_with(other, ready))
    by_type = {c["type"]: c for c in status["conditions"]}
    assert by_type["example.com/Probe"] == other
    assert (by_type["Ready"]["status"], by_type["Ready"]["reason"]) == ("False", "NodeDeleted")
    expected = NOW if moved else parse_time(EARLIER)
    assert parse_time(by_type["Ready"]["lastTransitionTime"]) == expected


@pytest.mark.parametrize(
    ("timespec", "expected"),
    [
        ("microseconds", "2030-01-01T12:00:00.250000Z"),
        ("seconds", "2030-01-01T12:00:00Z"),
        ("auto", "2030-01-01T12:00:00.250000Z"),
    ],
)
def test_rfc3339_is_utc_with_a_z_at_the_precision_asked(timespec: str, expected: str) -> None:
    elsewhere = NOW.astimezone(timezone(timedelta(hours=-5)))
    assert rfc3339(elsewhere, timespec) == expected  # type: ignore[arg-type]
    assert parse_time(expected) == (NOW.replace(microsecond=0) if timespec == "seconds" else NOW)
