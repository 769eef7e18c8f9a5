"""policy.pulling.credentials and the verify step of policy.pulling.decision: which images a
sandbox's credential must verify before running, and the bounded records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sandlot.policy.pulling.credentials import (
    SHARED_IDENTITY,
    AccessRecords,
    InvalidAllowlistEntry,
    VerifyPolicy,
    allowlisted,
    check_allowlist,
    credential_identity,
    needs_verification,
)
from sandlot.policy.pulling.decision import (
    FailureKind,
    PullAction,
    PullHistory,
    PullPolicy,
    decide_pull,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
A = credential_identity("reg:5000", ("a", "pw-a"))
B = credential_identity("reg:5000", ("b", "pw-b"))
REPO = "reg:5000/private"


def test_identities_differ_by_registry_user_and_password_and_none_is_shared() -> None:
    ids = {
        credential_identity("reg:5000", ("a", "pw")),
        credential_identity("reg:5001", ("a", "pw")),
        credential_identity("reg:5000", ("b", "pw")),
        credential_identity("reg:5000", ("a", "other")),
    }
    assert len(ids) == 4
    assert all(i.startswith("sha256:") and "pw" not in i for i in ids)
    assert credential_identity("reg:5000", None) == SHARED_IDENTITY


P = VerifyPolicy


@pytest.mark.parametrize(
    ("policy", "identity", "verified", "pulled", "allow", "needed"),
    [
        (P.NEVER_VERIFY, B, frozenset({A}), True, (), False),
        (P.NEVER_VERIFY_PRELOADED, B, frozenset({A}), True, (), True),
        (P.NEVER_VERIFY_PRELOADED, SHARED_IDENTITY, frozenset({A}), True, (), True),
        (P.NEVER_VERIFY_PRELOADED, A, frozenset({A}), True, (), False),
        (P.NEVER_VERIFY_PRELOADED, B, frozenset(), False, (), False),
        (P.NEVER_VERIFY_ALLOWLISTED, B, frozenset(), False, (REPO,), False),
        (P.NEVER_VERIFY_ALLOWLISTED, B, frozenset(), False, ("reg:5000/*",), False),
        (P.NEVER_VERIFY_ALLOWLISTED, B, frozenset(), False, ("other/*",), True),
        (P.NEVER_VERIFY_ALLOWLISTED, B, frozenset(), True, (REPO,), True),
        (P.ALWAYS_VERIFY, B, frozenset(), False, (REPO,), True),
        (P.ALWAYS_VERIFY, B, frozenset({B}), False, (), False),
    ],
    ids=[
        "never-verify-runs-anyone",
        "default-verifies-another-identity-on-a-pulled-image",
        "default-verifies-anonymous-on-an-image-pulled-with-a-credential",
        "default-runs-the-identity-that-pulled",
        "default-runs-a-preloaded-image",
        "allowlisted-preloaded-runs",
        "allowlisted-prefix-runs",
        "preloaded-off-the-allowlist-verifies",
        "allowlisted-but-pulled-verifies",
        "always-verifies-even-preloaded",
        "always-runs-a-verified-identity",
    ],
)
def test_which_images_need_their_credential_verified(
    policy: VerifyPolicy,
    identity: str,
    verified: frozenset[str],
    pulled: bool,
    allow: tuple[str, ...],
    needed: bool,
) -> None:
    got = needs_verification(
        policy,
        identity=identity,
        verified=verified,
        pulled_by_agent=pulled,
        repository=REPO,
        allowlist=allow,
    )
    assert got is needed


@pytest.mark.parametrize("entry", ["reg/x:1", "reg/x@sha256:00", "reg/*/x", "*", ""], ids=str)
def test_allowlist_refuses_tags_digests_and_other_wildcards(entry: str) -> None:
    with pytest.raises(InvalidAllowlistEntry, match="allowlist entry"):
        check_allowlist([entry])


def test_allowlist_prefix_matches_below_it_only() -> None:
    assert allowlisted("reg/team/app", ["reg/team/*"])
    assert not allowlisted("reg/teamother/app", ["reg/team/*"])
    assert not allowlisted("reg/team2", ["reg/team"])


def test_records_are_bounded_and_a_dropped_pair_only_needs_verifying_again() -> None:
    records = AccessRecords(max_images=2, max_identities=2)
    for identity in ("i1", "i2", "i3"):
        records.record("img-a", identity)
    assert records.verified("img-a") == {"i2", "i3"}
    records.record("img-b", "i1")
    records.record("img-c", "i1")
    assert records.verified("img-a") == frozenset()  # the oldest image went first
    assert records.verified("img-c") == {"i1"}


def test_records_round_trip_and_garbage_reads_as_empty() -> None:
    records = AccessRecords()
    records.record("img", A)
    assert records.record("img", A) is False  # nothing new to save
    again = AccessRecords.from_json(records.to_json())
    assert again.verified("img") == {A}
    assert AccessRecords.from_json({"version": 99, "images": {"img": [A]}}).pairs == {}
    assert AccessRecords.from_json({"version": 1, "images": {"img": "x"}}).pairs == {}


PRESENT = {"present": True, "history": PullHistory(), "joined": None, "now": T0}


@pytest.mark.parametrize(
    "policy", [PullPolicy.IF_NOT_PRESENT, PullPolicy.NEVER], ids=["if-not-present", "never"]
)
def test_a_present_image_not_verified_for_the_credential_is_verified_not_run(
    policy: PullPolicy,
) -> None:
    assert decide_pull(policy, **PRESENT, verified=True).action is PullAction.RUN  # type: ignore[arg-type]
    assert decide_pull(policy, **PRESENT, verified=False).action is PullAction.VERIFY  # type: ignore[arg-type]


def test_refused_verifications_back_off_then_fail_like_pulls() -> None:
    history = PullHistory()
    actions = []
    now = T0
    for _ in range(3):
        history = history.failed(FailureKind.UNAUTHORIZED, "HTTP 401 Unauthorized", now)
        decision = decide_pull(
            PullPolicy.IF_NOT_PRESENT,
            present=True,
            history=history,
            joined=None,
            now=now + timedelta(seconds=1),
            verified=False,
        )
        actions.append(decision.action)
        now += timedelta(minutes=10)
    assert actions == [PullAction.BACK_OFF, PullAction.BACK_OFF, PullAction.FAIL]
