"""The stream gateway's session caps (``policy.sessioncaps``): who a stream counts
against, and the cap that refuses it."""

from __future__ import annotations

import pytest

from sandlot.policy.sessioncaps import (
    SessionCaps,
    SessionCounts,
    counted_groups,
    give_back_session,
    service_account_namespace,
    take_session,
)

CAPS = SessionCaps(total=10, per_user=3, per_namespace=4)


def opened(*users: str) -> SessionCounts:
    counts = SessionCounts()
    for user in users:
        counts, refused = take_session(CAPS, counts, user)
        assert refused is None, refused
    return counts


@pytest.mark.parametrize(
    ("user", "namespace"),
    [
        ("system:serviceaccount:team-a:ci", "team-a"),
        ("system:serviceaccount:team-a:", None),
        ("system:serviceaccount::ci", None),
        ("system:serviceaccount:team-a", None),
        ("alice", None),
        ("system:node:node-1", None),
        ("", None),
    ],
    ids=["service-account", "no-name", "no-namespace", "no-separator", "user", "node", "anonymous"],
)
def test_only_a_service_accounts_user_name_has_a_namespace(
    user: str, namespace: str | None
) -> None:
    assert service_account_namespace(user) == namespace


@pytest.mark.parametrize(
    ("held", "user", "refused_by"),
    [
        ((), "alice", None),
        (("alice",) * 3, "alice", "max_sessions_per_user"),
        (("alice",) * 3, "bob", None),
        (
            tuple(f"system:serviceaccount:team-a:sa{i}" for i in range(4)),
            "system:serviceaccount:team-a:sa9",
            "max_sessions_per_namespace",
        ),
        (
            tuple(f"system:serviceaccount:team-a:sa{i}" for i in range(4)),
            "system:serviceaccount:team-b:sa0",
            None,
        ),
        (tuple(f"system:serviceaccount:team-a:sa{i}" for i in range(4)), "alice", None),
        (
            ("system:serviceaccount:team-a:ci",) * 3,
            "system:serviceaccount:team-a:ci",
            "max_sessions_per_user",
        ),
        (tuple(f"u{i}" for i in range(10)), "alice", "max_sessions"),
    ],
    ids=[
        "first",
        "user-at-its-cap",
        "another-user",
        "many-service-accounts-share-their-namespaces-cap",
        "another-namespace",
        "a-user-is-not-a-namespace",
        "a-service-account-at-its-user-cap",
        "replica-full",
    ],
)
def test_a_stream_counts_against_its_user_and_its_service_accounts_namespace(
    held: tuple[str, ...], user: str, refused_by: str | None
) -> None:
    before = opened(*held)
    after, refused = take_session(CAPS, before, user)
    if refused_by is None:
        assert refused is None, refused
        assert after.open == before.open + 1
    else:
        assert refused is not None and f"({refused_by})" in refused, refused
        assert after == before


def test_a_refusal_names_the_namespace_and_its_cap() -> None:
    full = opened(*(f"system:serviceaccount:team-a:sa{i}" for i in range(4)))
    _, refused = take_session(CAPS, full, "system:serviceaccount:team-a:sa9")
    assert refused == (
        'the service accounts of namespace "team-a" have 4 streams open '
        "(max_sessions_per_namespace)"
    )


def test_giving_back_frees_the_users_and_the_namespaces_place() -> None:
    full = opened(*(f"system:serviceaccount:team-a:sa{i}" for i in range(4)))
    freed = give_back_session(full, "system:serviceaccount:team-a:sa0")
    assert dict(freed.by_namespace) == {"team-a": 3}
    assert "system:serviceaccount:team-a:sa0" not in freed.by_user
    _, refused = take_session(CAPS, freed, "system:serviceaccount:team-a:sa9")
    assert refused is None
    emptied = full
    for user in full.by_user:
        emptied = give_back_session(emptied, user)
    assert emptied == SessionCounts()


def test_giving_back_a_stream_never_taken_changes_nothing() -> None:
    counts = opened("system:serviceaccount:team-a:sa0")
    assert give_back_session(counts, "system:serviceaccount:team-a:sa1") == counts
    assert give_back_session(counts, "alice") == counts


GROUP_CAPS = SessionCaps(total=20, per_user=3, per_namespace=4, per_group=5)


def test_many_users_of_one_group_share_its_cap_and_the_universal_groups_count_nothing() -> None:
    counts = SessionCounts()
    everyone = ("system:authenticated", "team-a")
    for i in range(5):
        counts, refused = take_session(GROUP_CAPS, counts, f"oidc:user{i}", everyone)
        assert refused is None, refused
    assert dict(counts.by_group) == {"team-a": 5}
    _, refused = take_session(GROUP_CAPS, counts, "oidc:user9", everyone)
    assert refused == 'the members of group "team-a" have 5 streams open (max_sessions_per_group)'
    # Another team's users, in the same universal groups, are not held by team-a.
    counts, refused = take_session(GROUP_CAPS, counts, "oidc:other", ("system:authenticated",))
    assert refused is None, refused
    # Giving one back frees team-a's place.
    counts = give_back_session(counts, "oidc:user0", everyone)
    assert dict(counts.by_group) == {"team-a": 4}
    _, refused = take_session(GROUP_CAPS, counts, "oidc:user9", everyone)
    assert refused is None


@pytest.mark.parametrize(
    ("groups", "counted"),
    [
        (("system:authenticated", "system:serviceaccounts"), ()),
        (("system:serviceaccounts:team-a", "system:unauthenticated"), ()),
        (("b", "a", "b", ""), ("a", "b")),
        (("system:masters",), ("system:masters",)),
    ],
    ids=["universal", "a-namespaces-service-accounts", "each-once", "admins-count-too"],
)
def test_a_stream_counts_against_each_of_its_callers_own_groups_once(
    groups: tuple[str, ...], counted: tuple[str, ...]
) -> None:
    assert counted_groups(groups) == counted
