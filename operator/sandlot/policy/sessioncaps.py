"""The stream gateway's session caps: who a stream counts against, and whether one
more may open. Pure counting, under the gateway's lock.

A cap per user name alone lets one tenant multiply its share: every
ServiceAccount it makes in its namespace is a user of its own. So a stream of a
ServiceAccount (``system:serviceaccount:<namespace>:<name>``) counts against its
user's cap and against its namespace's, which all that namespace's
ServiceAccounts share; any other user counts against its own cap only (it has no
namespace the gateway can tell).

The same holds for the users an identity provider mints: a tenant whose people
(or programs) are many users of one group shares that group's cap. A stream
counts against each group the API server named for its caller, except the groups
everyone (or every ServiceAccount) is in: ``system:authenticated``,
``system:unauthenticated``, ``system:serviceaccounts`` and
``system:serviceaccounts:<namespace>`` (the namespace cap counts those).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"
UNIVERSAL_GROUPS = frozenset(
    {"system:authenticated", "system:unauthenticated", "system:serviceaccounts"}
)
"""Groups every caller (or every ServiceAccount) is in: no tenant's share."""
_NAMESPACE_GROUP_PREFIX = "system:serviceaccounts:"


def service_account_namespace(user: str) -> str | None:
    """The namespace of a ServiceAccount's user name; None for any other user."""
    if not user.startswith(SERVICE_ACCOUNT_PREFIX):
        return None
    namespace, sep, name = user[len(SERVICE_ACCOUNT_PREFIX) :].partition(":")
    return namespace if sep and namespace and name else None


def counted_groups(groups: Iterable[str]) -> tuple[str, ...]:
    """The caller's groups a stream counts against: each once, less the universal
    ones and a ServiceAccount namespace's own group."""
    return tuple(
        sorted(
            {
                g
                for g in groups
                if g and g not in UNIVERSAL_GROUPS and not g.startswith(_NAMESPACE_GROUP_PREFIX)
            }
        )
    )


@dataclass(frozen=True)
class SessionCaps:
    total: int
    """Streams open at once in one gateway replica."""
    per_user: int
    """Streams one user name may have open at once."""
    per_namespace: int
    """Streams the ServiceAccounts of one namespace may have open at once, together."""
    per_group: int | None = None
    """Streams the members of one group may have open at once, together (None: the
    replica's total)."""


@dataclass(frozen=True)
class SessionCounts:
    """Open streams by user, and ServiceAccounts' streams by their namespace."""

    by_user: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    by_namespace: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    by_group: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

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
    caps: SessionCaps, counts: SessionCounts, user: str, groups: Iterable[str] = ()
) -> tuple[SessionCounts, str | None]:
    """One more stream for ``user`` (in ``groups``): the new counts, or the old ones
    and why not (the cap it would pass, named by its setting)."""
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
    per_group = caps.per_group if caps.per_group is not None else caps.total
    counted = counted_groups(groups)
    for group in counted:
        if counts.by_group.get(group, 0) >= per_group:
            return counts, (
                f'the members of group "{group}" have {per_group} streams open '
                "(max_sessions_per_group)"
            )
    return _moved_all(counts, user, namespace, counted, 1), None


def give_back_session(
    counts: SessionCounts, user: str, groups: Iterable[str] = ()
) -> SessionCounts:
    """``user``'s stream ended (a user with none open is left as it is); ``groups``
    as given when it was taken."""
    if counts.by_user.get(user, 0) <= 0:
        return counts
    return _moved_all(counts, user, service_account_namespace(user), counted_groups(groups), -1)


def _moved_all(
    counts: SessionCounts, user: str, namespace: str | None, groups: tuple[str, ...], by: int
) -> SessionCounts:
    by_namespace = counts.by_namespace
    if namespace is not None:
        by_namespace = _moved(by_namespace, namespace, by)
    by_group = counts.by_group
    for group in groups:
        by_group = _moved(by_group, group, by)
    return SessionCounts(_moved(counts.by_user, user, by), by_namespace, by_group)


__all__ = [
    "SERVICE_ACCOUNT_PREFIX",
    "UNIVERSAL_GROUPS",
    "SessionCaps",
    "SessionCounts",
    "counted_groups",
    "give_back_session",
    "service_account_namespace",
    "take_session",
]
