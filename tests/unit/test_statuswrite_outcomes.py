"""``adapters.statuswrite.write_status`` decided on what the Objects boundary answers:
each outcome, with a fake of that boundary (its real behaviour against the API
server is claimed in tests/integration/test_statuswrite.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.statuswrite import WriteOutcome, write_status
from sandlot.api.sandbox import SandboxPhase


def body(
    phase: str = "Scheduled", *, rv: str = "a1", uid: str = "u1", node: str = "n1"
) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "box", "uid": uid, "resourceVersion": rv},
        "spec": {"nodeName": node},
        "status": {"phase": phase},
    }


class FakeObjects:
    """Answers patches from ``patches`` (an exception or None) and re-reads from
    ``reads``, recording the resourceVersions sent."""

    def __init__(self, patches: list[Exception | None], reads: list[Any] = ()) -> None:
        self.patches = list(patches)
        self.reads = list(reads)
        self.sent: list[str | None] = []

    def patch_sandbox_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        self.sent.append(resource_version)
        answer = self.patches.pop(0)
        if answer is not None:
            raise answer
        return {}

    def get_sandbox(self, namespace: str, name: str) -> dict[str, Any]:
        answer = self.reads.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)


def api(status: int) -> ApiException:
    return ApiException(
        status=status,
        reason={
            400: "Bad Request",
            403: "Forbidden",
            404: "Not Found",
            409: "Conflict",
            422: "Unprocessable Entity",
            429: "Too Many Requests",
            500: "Boom",
            503: "Service Unavailable",
        }[status],
    )


CASES = {
    "written-first-time": ([None], [], WriteOutcome.WRITTEN, ["a1"]),
    "conflict-then-written-with-the-reread-version": (
        [api(409), None],
        [body(rv="zz9")],
        WriteOutcome.WRITTEN,
        ["a1", "zz9"],
    ),
    "not-found-on-patch-is-gone": ([api(404)], [], WriteOutcome.GONE, ["a1"]),
    "not-found-on-reread-is-gone": ([api(409)], [api(404)], WriteOutcome.GONE, ["a1"]),
    "recreated-new-uid-is-gone": ([api(409)], [body(uid="u2", rv="b")], WriteOutcome.GONE, ["a1"]),
    "rebound-other-node-is-gone": (
        [api(409)],
        [body(node="n2", rv="b")],
        WriteOutcome.GONE,
        ["a1"],
    ),
    "terminal-on-reread-is-skipped": ([api(409)], [body("Stopped")], WriteOutcome.SKIPPED, ["a1"]),
    "dead-on-reread-is-skipped": ([api(409)], [body("Dead")], WriteOutcome.SKIPPED, ["a1"]),
    "other-api-error-fails": ([api(500)], [], WriteOutcome.FAILED, ["a1"]),
    "unavailable-fails": ([api(503)], [], WriteOutcome.FAILED, ["a1"]),
    "too-many-requests-fails-transiently": ([api(429)], [], WriteOutcome.FAILED, ["a1"]),
    "invalid-is-refused": ([api(422)], [], WriteOutcome.REFUSED, ["a1"]),
    "forbidden-is-refused": ([api(403)], [], WriteOutcome.REFUSED, ["a1"]),
    "bad-request-is-refused": ([api(400)], [], WriteOutcome.REFUSED, ["a1"]),
    "no-answer-fails-without-raising": (
        [ConnectionError("reset")],
        [],
        WriteOutcome.FAILED,
        ["a1"],
    ),
    "reread-error-fails": ([api(409)], [api(500)], WriteOutcome.FAILED, ["a1"]),
    "conflicting-every-time": (
        [api(409)] * 3,
        [body(rv="b"), body(rv="c"), body(rv="d")],
        WriteOutcome.CONFLICTED,
        ["a1", "b", "c"],
    ),
}


@pytest.mark.parametrize(("patches", "reads", "outcome", "sent"), CASES.values(), ids=list(CASES))
def test_write_outcome(
    patches: list[Exception | None], reads: list[Any], outcome: WriteOutcome, sent: list[str]
) -> None:
    objects = FakeObjects(patches, reads)
    result = write_status(objects, body(), {"phase": "Running"}, node="n1", max_attempts=3)
    assert result.outcome is outcome, result
    assert objects.sent == sent


@pytest.mark.parametrize(
    ("phase", "outcome", "patched"),
    [
        ("Scheduled", WriteOutcome.WRITTEN, True),
        ("Running", WriteOutcome.SKIPPED, False),
        ("Failed", WriteOutcome.SKIPPED, False),
    ],
    ids=["allowed", "not-allowed", "terminal"],
)
def test_allowed_from_is_checked_before_any_write(
    phase: str, outcome: WriteOutcome, patched: bool
) -> None:
    objects = FakeObjects([None])
    allowed = {SandboxPhase.PENDING, SandboxPhase.SCHEDULED}
    result = write_status(objects, body(phase), {"phase": "Running"}, allowed_from=allowed)
    assert result.outcome is outcome
    assert bool(objects.sent) is patched


def test_node_defaults_to_the_one_the_object_was_read_on() -> None:
    objects = FakeObjects([api(409)], [body(node="elsewhere", rv="b")])
    assert write_status(objects, body(), {"phase": "Dead"}).outcome is WriteOutcome.GONE


def test_detail_names_the_failure() -> None:
    objects = FakeObjects([api(500)])
    assert write_status(objects, body(), {"phase": "Dead"}).detail == "500 Boom"
