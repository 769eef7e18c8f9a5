"""The routine wake-up's short cut (``policy.nodehealth.ready_until``), checked against
``decide`` itself: a node found READY with nothing to write stays so, on the same
stored status, for as long as ``ready_until`` says, whatever the renewal and time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sandlot.api.node import NodeHealthTracking, NodePhase, ObservedRenewal
from sandlot.policy.disruption import FleetSummary, GuardSettings
from sandlot.policy.nodehealth import (
    DecisionKind,
    NodeHealthSettings,
    NodeView,
    decide,
    ready_conditions,
    ready_until,
)
from tests.unit.test_nodehealth_controller import World

T0 = datetime(2030, 1, 1, tzinfo=UTC)
SETTINGS = NodeHealthSettings(
    grace_period=timedelta(seconds=60), unseen_lease_duration=timedelta(seconds=20)
)
GUARD = GuardSettings()
FLEETS = st.sampled_from(
    [
        FleetSummary(total_not_disabled=10, not_ready=1),
        FleetSummary(total_not_disabled=10, not_ready=9),
    ]
)
seconds = st.integers(min_value=-300, max_value=300).map(lambda s: T0 + timedelta(seconds=s))
renewals = st.one_of(
    st.none(),
    st.builds(
        lambda at, d: ObservedRenewal(observed_at=at, lease_duration_seconds=d),
        seconds,
        st.integers(min_value=1, max_value=60),
    ),
)
trackings = st.one_of(
    st.just(NodeHealthTracking()),
    st.builds(
        lambda since: NodeHealthTracking(unhealthy_since=since),
        seconds,
    ),
)


@st.composite
def stored_nodes(draw: st.DrawFn) -> NodeView:
    phase = draw(st.sampled_from([None, *NodePhase]))
    conditions = ready_conditions(phase, (), T0) if phase is not None else None
    return NodeView(
        "n1",
        draw(st.booleans()),
        draw(seconds),
        phase,
        draw(st.sampled_from([(), conditions or ()])),
    )


def _quiet(node: NodeView, renewal: ObservedRenewal | None, tracking: NodeHealthTracking,
           now: datetime, fleet: FleetSummary) -> bool:  # fmt: skip
    """The pass decides CLEAR and writes nothing (the Ready condition included)."""
    d = decide(node, renewal, tracking, now, fleet, GUARD, SETTINGS)
    return (
        d.kind is DecisionKind.CLEAR
        and d.patch is None
        and ready_conditions(NodePhase.READY, node.conditions, now) is None
    )


@settings(max_examples=500, deadline=None)
@given(stored_nodes(), trackings, renewals, renewals, seconds, seconds, FLEETS, FLEETS)
def test_a_quiet_ready_pass_stays_quiet_on_the_same_status_while_ready_until_holds(
    node: NodeView,
    tracking: NodeHealthTracking,
    first: ObservedRenewal | None,
    later: ObservedRenewal | None,
    at: datetime,
    then: datetime,
    fleet: FleetSummary,
    fleet_then: FleetSummary,
) -> None:
    unseen = SETTINGS.unseen_lease_duration
    until = ready_until(node, later, then, unseen)
    d = decide(node, later, tracking, then, fleet_then, GUARD, SETTINGS)
    assert (until is not None) == (d.phase is NodePhase.READY)
    if until is not None:
        assert until > then
    if until is not None and _quiet(node, first, tracking, at, fleet):
        assert _quiet(node, later, tracking, then, fleet_then)


def test_a_steady_nodes_wake_up_at_its_old_expiry_decides_nothing_until_the_resync(
    monkeypatch,
) -> None:
    import sandlot.controllers.nodehealth as controller
    from sandlot.policy.nodehealth import decide as real  # what the controller calls

    decided: list[str] = []

    def counting(node, *args, **kwargs):
        decided.append(node.name)
        return real(node, *args, **kwargs)

    monkeypatch.setattr(controller, "decide", counting)
    w = World()
    w.step()  # first pass: Ready written (its own write's event brings nothing new)
    w.step()
    lease = w.due_in("n1")
    assert lease is not None and decided, "the first pass decides in full"
    w.clock.advance(lease - 1)
    w.renew("n1")
    w.clock.advance(1)
    w.step()  # a full pass over the status as written: nothing to write, steady
    assert w.due_in("n1") == lease - 1
    decided.clear()
    w.clock.advance(lease - 1)
    w.renew("n1")  # renewed a second before the expiry its wake-up was set for
    w.clock.advance(1)
    assert w.step() == ["n1"], "the wake-up at the old expiry ran"
    assert decided == [], "a steady node's wake-up decides nothing"
    assert w.due_in("n1") == lease - 1, "it wakes again at the new expiry, exactly"
    w.ctl.enqueue("n1")  # the resync timer
    w.step()
    assert decided == ["n1"], "the resync timer's pass decides in full"
    w.clock.advance(lease)  # no renewal: the lease ends
    w.step()
    assert w.health("n1").get("unhealthySince"), "a lapsed lease still starts tracking"
