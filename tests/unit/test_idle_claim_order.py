"""Whether a member's idle pause or suspension came before the claim that took it
is told without comparing two machines' clocks (SPEC section 8): the condition's
time is the node's, the claim's the operator's, and a node's clock may be hours
off either way. The bind records the idle episode it found the member in
(``sandlot.dev/claimed-idle``); a restarted agent (nothing remembered) wakes the
member for its claim only when that is the episode it still sees.

Through the claim controller over a fake API and a fake clock; the node's agent
writes its conditions on its own clock, ``skew`` off the operator's."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from sandlot.api.timestamps import rfc3339
from sandlot.policy.idle import claim_wakes
from tests.unit.test_claims import ClaimWorld

SKEWS = [timedelta(hours=3), timedelta(hours=-3), timedelta(0)]
SKEW_IDS = ["node-3h-ahead", "node-3h-behind", "node-on-time"]


def warm_member(skew: timedelta) -> tuple[ClaimWorld, str]:
    w = ClaimWorld()
    w.node("a", capacity=10)
    pool = w.pool("web", replicas=1)
    w.step()
    w.run_members()
    w.step()
    (member,) = w.members(pool)
    w.skew = skew  # type: ignore[attr-defined]
    return w, member


def agent_writes(w: ClaimWorld, key: str, kind: str, status: str, reason: str) -> None:
    """The node's agent sets ``kind`` on the member, timed on the node's clock."""
    body = w.objects.sandboxes[key]
    node_now = w.clock.now() + w.skew  # type: ignore[attr-defined]
    kept = [c for c in body["status"].get("conditions") or [] if c["type"] != kind]
    changed = {"type": kind, "status": status, "reason": reason, "message": "m"}
    body["status"]["conditions"] = [*kept, changed | {"lastTransitionTime": rfc3339(node_now)}]
    w.objects.touch(body)


def claimed(w: ClaimWorld, member: str) -> dict[str, Any]:
    w.claim("mine", "web")
    w.step()
    status = w.objects.claims["ns/mine"]["status"]
    assert status.get("phase") == "Bound" and f"ns/{status['sandboxName']}" == member, status
    return w.objects.sandboxes[member]


@pytest.mark.parametrize("kind", ["Paused", "Suspended"])
@pytest.mark.parametrize("skew", SKEWS, ids=SKEW_IDS)
def test_a_member_idle_before_its_claim_is_woken_whatever_the_nodes_clock(
    skew: timedelta, kind: str
) -> None:
    w, member = warm_member(skew)
    agent_writes(w, member, kind, "True", "Idle")
    w.step()
    w.clock.advance(30)
    obj = claimed(w, member)
    assert claim_wakes(obj, paused_unclaimed=False), "an idle member claimed was not woken"
    (idle,) = (c for c in obj["status"]["conditions"] if c["type"] == kind)
    mark = f"{kind} {idle['lastTransitionTime']}"
    assert obj["metadata"]["annotations"]["sandlot.dev/claimed-idle"] == mark


@pytest.mark.parametrize("skew", SKEWS, ids=SKEW_IDS)
def test_a_member_idle_after_its_claim_waits_for_use_whatever_the_nodes_clock(
    skew: timedelta,
) -> None:
    w, member = warm_member(skew)
    claimed(w, member)
    w.clock.advance(60)
    agent_writes(w, member, "Paused", "True", "Idle")
    obj = w.objects.sandboxes[member]
    assert "sandlot.dev/claimed-idle" not in (obj["metadata"].get("annotations") or {})
    assert not claim_wakes(obj, paused_unclaimed=False), "woken for a claim it idled after"


@pytest.mark.parametrize("skew", SKEWS, ids=SKEW_IDS)
def test_a_member_woken_for_its_claim_and_idle_again_waits_for_use(skew: timedelta) -> None:
    w, member = warm_member(skew)
    agent_writes(w, member, "Paused", "True", "Idle")
    w.step()
    claimed(w, member)
    w.clock.advance(5)
    agent_writes(w, member, "Paused", "False", "Resumed")  # the claim woke it
    w.clock.advance(60)
    agent_writes(w, member, "Paused", "True", "Idle")  # idle again, after its claim
    assert not claim_wakes(w.objects.sandboxes[member], paused_unclaimed=False)
