"""Image pulling's decisions, pure: what an image reference is, whether to pull,
wait, back off or fail (``decision``), where registry requests may go
(``access``), what of a failure a tenant sees (``messages``), which credential a
registry gets (``auth``) and when an image already on the node needs its
credential verified (``credentials``).

Callers outside the package import from here; the modules import each other.
"""

from sandlot.policy.pulling.access import (
    RegistryAccess,
    address_refusal,
    realm_refusal,
    redirect_refusal,
    same_host,
    status_message,
)
from sandlot.policy.pulling.auth import credential_for
from sandlot.policy.pulling.credentials import (
    SHARED_IDENTITY,
    AccessRecords,
    VerifyPolicy,
    check_allowlist,
    credential_identity,
    needs_verification,
)
from sandlot.policy.pulling.decision import (
    BACKOFF_BASE,
    BACKOFF_CAP,
    FailureKind,
    PullAction,
    PullDecision,
    PullHistory,
    PullPolicy,
    decide_pull,
)
from sandlot.policy.pulling.messages import public_message
from sandlot.policy.pulling.reference import ImageReference, InvalidReference, parse_reference

__all__ = [
    "BACKOFF_BASE",
    "BACKOFF_CAP",
    "SHARED_IDENTITY",
    "AccessRecords",
    "FailureKind",
    "ImageReference",
    "InvalidReference",
    "PullAction",
    "PullDecision",
    "PullHistory",
    "PullPolicy",
    "RegistryAccess",
    "VerifyPolicy",
    "address_refusal",
    "check_allowlist",
    "credential_for",
    "credential_identity",
    "decide_pull",
    "needs_verification",
    "parse_reference",
    "public_message",
    "realm_refusal",
    "redirect_refusal",
    "same_host",
    "status_message",
]
