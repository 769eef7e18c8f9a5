"""A node's stream slots and the suspensions they exclude (``policy.streamslots``),
as plain data: a suspension and a stream admission into the same sandbox exclude
each other, a slot is freed once whatever ends its connection, and an admission
waits within the gateway's open timeout."""

from __future__ import annotations

import pytest

from sandlot.policy.streamslots import (
    ANSWER_ROOM,
    MAX_ADMISSION_WAIT,
    Admission,
    StreamSlots,
    admission_wait,
    admit,
    begin_suspension,
    end_suspension,
    release,
)

KEY, OTHER = "ns/sb", "ns/other"


def slots(*used: str | None, limit: int = 4, suspending: tuple[str, ...] = ()) -> StreamSlots:
    state = StreamSlots(limit=limit, suspending=frozenset(suspending))
    for connection, key in enumerate(used):
        state, admission = admit(state, connection, key)
        assert admission is Admission.ADMITTED
    return state


ADMISSIONS = [
    ("a-free-node-admits", slots(), KEY, Admission.ADMITTED),
    ("a-full-node-refuses", slots(OTHER, None, limit=2), KEY, Admission.FULL),
    ("a-full-node-refuses-a-log-too", slots(OTHER, limit=1), None, Admission.FULL),
    ("a-sandbox-being-suspended-refuses", slots(suspending=(KEY,)), KEY, Admission.SUSPENDING),
    ("another-sandbox-being-suspended-admits", slots(suspending=(OTHER,)), KEY, Admission.ADMITTED),
    (
        "a-log-of-a-sandbox-being-suspended-admits",
        slots(suspending=(KEY,)),
        None,
        Admission.ADMITTED,
    ),
    ("a-second-stream-into-one-sandbox-admits", slots(KEY), KEY, Admission.ADMITTED),
]


@pytest.mark.parametrize(
    ("state", "key", "expected"), [a[1:] for a in ADMISSIONS], ids=[a[0] for a in ADMISSIONS]
)
def test_an_admission_takes_a_slot_unless_the_node_is_full_or_the_sandbox_is_being_suspended(
    state: StreamSlots, key: str | None, expected: Admission
) -> None:
    after, admission = admit(state, 99, key)
    assert admission is expected
    if expected is Admission.ADMITTED:
        assert after.used[99] == key and len(after.used) == len(state.used) + 1
    else:
        assert after == state, "a refused admission took a slot"


SUSPENSIONS = [
    ("no-stream-begins", slots(), KEY, True),
    ("a-stream-into-it-holds-it-off", slots(KEY), KEY, False),
    ("a-stream-into-another-does-not", slots(OTHER), KEY, True),
    ("a-log-of-it-does-not", slots(None), KEY, True),
    ("one-already-begun-holds-a-second-off", slots(suspending=(KEY,)), KEY, False),
]


@pytest.mark.parametrize(
    ("state", "key", "begins"), [s[1:] for s in SUSPENSIONS], ids=[s[0] for s in SUSPENSIONS]
)
def test_a_suspension_begins_only_while_no_stream_uses_its_sandbox(
    state: StreamSlots, key: str, begins: bool
) -> None:
    after, begun = begin_suspension(state, key)
    assert begun is begins
    assert (key in after.suspending) is (begins or key in state.suspending)
    assert after.used == state.used


def test_a_suspension_and_an_admission_into_one_sandbox_exclude_each_other_either_way() -> None:
    # The suspension first: no stream into it until it ends, then one is admitted.
    state, begun = begin_suspension(slots(), KEY)
    assert begun
    state, admission = admit(state, 1, KEY)
    assert admission is Admission.SUSPENDING
    state = end_suspension(state, KEY)
    state, admission = admit(state, 1, KEY)
    assert admission is Admission.ADMITTED
    # The stream first: no suspension until its connection ends, then one begins.
    state, begun = begin_suspension(state, KEY)
    assert not begun
    state, used = release(state, 1)
    assert used == KEY
    state, begun = begin_suspension(state, KEY)
    assert begun


def test_a_slot_is_freed_once_whatever_ends_its_connection_first() -> None:
    state = slots(KEY, None)
    state, used = release(state, 0)  # the socket closed during the admission
    assert used == KEY and state.sessions(KEY) == 0 and state.in_use() == frozenset()
    state, again = release(state, 0)  # then the refused upgrade, or the session's end
    assert again is None, "released twice: the end of its stream was said twice"
    state, log = release(state, 1)
    assert log is None and len(state.used) == 0


def test_sessions_and_in_use_count_exec_files_and_port_forward_not_logs() -> None:
    state = slots(KEY, KEY, None, OTHER)
    assert (state.sessions(KEY), state.sessions(OTHER), state.sessions("ns/none")) == (2, 1, 0)
    assert state.in_use() == frozenset({KEY, OTHER})


WAITS = [
    ("the-gateways-default-10s", "10", 10.0, 10.0 - ANSWER_ROOM),
    ("a-gateway-waiting-30s", "30", 10.0, 30.0 - ANSWER_ROOM),
    ("a-short-timeout-keeps-half", "2", 10.0, 1.0),
    ("no-header-the-agents-own", None, 10.0, 10.0 - ANSWER_ROOM),
    ("an-unreadable-header-the-agents-own", "soon", 10.0, 10.0 - ANSWER_ROOM),
    ("a-zero-header-the-agents-own", "0", 10.0, 10.0 - ANSWER_ROOM),
    ("a-negative-header-the-agents-own", "-5", 10.0, 10.0 - ANSWER_ROOM),
    ("not-a-number-the-agents-own", "nan", 10.0, 10.0 - ANSWER_ROOM),
    ("never-past-the-cap", "3600", 10.0, MAX_ADMISSION_WAIT),
    ("infinity-is-the-cap", "inf", 10.0, MAX_ADMISSION_WAIT),
]


@pytest.mark.parametrize(
    ("header", "default", "expected"), [w[1:] for w in WAITS], ids=[w[0] for w in WAITS]
)
def test_an_admission_waits_within_the_gateways_open_timeout(
    header: str | None, default: float, expected: float
) -> None:
    waited = admission_wait(header, default)
    assert waited == pytest.approx(expected)
    assert 0 < waited <= MAX_ADMISSION_WAIT
