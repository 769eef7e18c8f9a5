"""The stream gateway's session caps: who a stream counts against, and whether one
more may open. Pure counting, under the gateway's lock.

A cap per user name alone lets one tenant multiply its share: every
ServiceAccount it makes in its namespace is a user of its own. So a stream of a
ServiceAccount (``system:serviceaccount:<namespace>:<name>``) counts against its
user's cap and against its namespace's, which all that namespace's
ServiceAccounts share; any other user counts against its own cap only (it has no
namespace the gateway can tell).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


def service_account_namespace(user: str) -> str | None:
    """The namespace of a ServiceAccount's user name; None for any other user."""
    if not user.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, sep, name = user[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    return namespace if sep and namespace and name else None


@dataclass(frozen=True)
class SessionCaps:
    total: int
    """Streams open at once in one gateway replica."""
    per_user: int
    """Streams one user name may have open at once."""
    per_namespace: int
    """Streams the ServiceAccounts of one namespace may have open at once, together."""


@dataclass(frozen=True)
class SessionCounts:
    """Open streams by user, and ServiceAccounts' streams by their namespace."""

    by_user: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    by_namespace: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def open(self) -> int:
        return sum(self.by_user.values())


def _moved(counts: Mapping[str, int], key: str, by: int) -> Mapping[str, int]:
    moved = dict(counts)
    left = moved.get(key, 0) + by
    if left > 0:
        moved[key] = left
    else:
        moved.pop(key, None)
    return MappingProxyType(moved)


def take_session(
    caps: SessionCaps, counts: SessionCounts, user: str
) -> tuple[SessionCounts, str | None]:
    """One more stream for ``user``: the new counts, or the old ones and why not
    (the cap it would pass, named by its setting)."""
    if counts.open >= caps.total:
        return counts, f"this gateway replica has {caps.total} streams open (max_sessions)"
    if counts.by_user.get(user, 0) >= caps.per_user:
        return counts, f'user "{user}" has {caps.per_user} streams open (max_sessions_per_user)'
    namespace = service_account_namespace(user)
    if namespace is not None and counts.by_namespace.get(namespace, 0) >= caps.per_namespace:
        return counts, (
            f'the service accounts of namespace "{namespace}" have {caps.per_namespace} '
            "streams open (max_sessions_per_namespace)"
        )
    by_namespace = counts.by_namespace
    if namespace is not None:
        by_namespace = _moved(by_namespace, namespace, 1)
    return SessionCounts(_moved(counts.by_user, user, 1), by_namespace), None


def give_back_session(counts: SessionCounts, user: str) -> SessionCounts:
    """``user``'s stream ended (a user with none open is left as it is)."""
    if counts.by_user.get(user, 0) <= 0:
        return counts
    namespace = service_account_namespace(user)
    by_namespace = counts.by_namespace
    if namespace is not None:
        by_namespace = _moved(by_namespace, namespace, -1)
    return SessionCounts(_moved(counts.by_user, user, -1), by_namespace)


__all__ = [
    "SERVICE_ACCOUNT_PREFIX",
    "SessionCaps",
    "SessionCounts",
    "give_back_session",
    "service_account_namespace",
    "take_session",
]
