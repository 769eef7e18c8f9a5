"""An image's ``USER`` resolved through its own ``/etc/passwd`` and ``/etc/group``.

The OCI image config may name its user (``USER app``, ``app:staff``, ``1000:staff``);
the kernel only knows numbers. containerd's CRI plugin resolves the names inside
the image's root filesystem (runc's ``GetExecUser`` rules), and so does this
module, as plain text in and numbers out:

- a user name must have a passwd entry (else the sandbox cannot start: running a
  named user as root would be the silent escalation this exists to prevent);
- a numeric user without an entry runs with GID 0, as under runc;
- the group, when given, overrides the passwd entry's primary group;
- supplementary groups are those of ``/etc/group`` that list the user by name.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownImageUser(ValueError):
    """The image names a user or group its ``/etc/passwd`` or ``/etc/group`` lacks."""


@dataclass(frozen=True)
class ResolvedUser:
    uid: int
    gid: int
    additional_gids: tuple[int, ...] = ()


def _entries(text: str, fields: int) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(":")
        if len(parts) >= fields and parts[2].isdigit():
            rows.append(parts)
    return rows


def needs_lookup(user: str) -> bool:
    """True when ``user`` (``name[:group]``) names a user or group, not just numbers."""
    name, _, group = user.partition(":")
    return bool(name and not name.isdigit()) or bool(group and not group.isdigit())


def resolve_user(user: str, passwd: str, group: str) -> ResolvedUser:
    """``user`` as the image config spells it, resolved in the image's files."""
    name, _, group_name = user.partition(":")
    users = _entries(passwd, 7)
    entry = None
    if name.isdigit():
        uid = int(name)
        entry = next((row for row in users if int(row[2]) == uid), None)
    else:
        entry = next((row for row in users if row[0] == name), None)
        if entry is None:
            raise UnknownImageUser(
                f"the image's user {name!r} has no entry in the image's /etc/passwd"
            )
        uid = int(entry[2])
    gid = int(entry[3]) if entry is not None and entry[3].isdigit() else 0
    groups = _entries(group, 4)
    if group_name.isdigit():
        gid = int(group_name)
    elif group_name:
        match = next((row for row in groups if row[0] == group_name), None)
        if match is None:
            raise UnknownImageUser(
                f"the image's group {group_name!r} has no entry in the image's /etc/group"
            )
        gid = int(match[2])
    login = entry[0] if entry is not None else ""
    extra = tuple(
        sorted(
            {
                int(row[2])
                for row in groups
                if login and login in row[3].split(",") and int(row[2]) != gid
            }
        )
    )
    return ResolvedUser(uid, gid, extra)
