"""User namespaces for ``hostUsers: false``: which host IDs a sandbox gets, and
how its OCI spec maps them. Pure.

Each such sandbox gets its own range of ``RANGE_SIZE`` host UIDs (and the same
GIDs): its UID 0 is the range's first ID, an unprivileged user on the node that
no other sandbox shares, as the kubelet gives each pod of ``hostUsers: false``
its own 65536 IDs. Ranges are aligned blocks between ``FIRST_ID`` and
``LAST_ID``, above the IDs a node's own users and ``/etc/subuid`` ranges use;
the ones in use are read back from the containers' labels, so an agent restart
never hands out a range a running sandbox holds.

runc 1.1 cannot idmap a mount, so the root filesystem's owners are shifted into
the range when it is made (``adapters.containerd.remap``); the spec maps the
range and, where the sandbox joins a network namespace made outside its user
namespace (CNI's, or the host's), binds ``/sys`` instead of mounting a sysfs the
kernel would refuse it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

RANGE_SIZE = 65536
"""Host IDs per sandbox: every 16-bit ID an image's files may use."""
FIRST_ID = 1 << 24
"""The first host ID handed out (16777216), clear of login users and subuid ranges."""
LAST_ID = (1 << 32) - 2
"""The last usable host ID (4294967294; 2^32-1 is the kernel's "no ID")."""


class NoFreeRange(ValueError):
    """Every range is taken."""


@dataclass(frozen=True, order=True)
class IdRange:
    """Host IDs ``[first, first + size)``, seen as ``[0, size)`` inside."""

    first: int
    size: int = RANGE_SIZE

    def overlaps(self, other: IdRange) -> bool:
        return self.first < other.first + other.size and other.first < self.first + self.size

    def label(self) -> str:
        return f"{self.first}-{self.size}"

    @classmethod
    def from_label(cls, text: str) -> IdRange | None:
        """The range a container label names; None for one that does not parse."""
        first, _, size = text.partition("-")
        try:
            parsed = cls(int(first), int(size))
        except ValueError:
            return None
        return parsed if parsed.first >= 0 and parsed.size > 0 else None


def pick_range(
    in_use: Iterable[IdRange],
    *,
    first: int = FIRST_ID,
    size: int = RANGE_SIZE,
    last: int = LAST_ID,
) -> IdRange:
    """The lowest aligned block of ``size`` IDs from ``first`` that overlaps none
    of ``in_use`` and ends by ``last``."""
    taken = sorted(in_use)
    candidate = IdRange(first, size)
    for held in taken:
        if held.first >= candidate.first + size:
            break
        if held.overlaps(candidate):
            # The next aligned block past this one; later ranges are checked in turn.
            end = held.first + held.size
            blocks = -(-(end - first) // size)
            candidate = IdRange(first + blocks * size, size)
    if candidate.first + size - 1 > last:
        raise NoFreeRange(f"no free range of {size} host IDs between {first} and {last}")
    return candidate


def _owns_network(oci: dict[str, Any]) -> bool:
    """Whether the sandbox makes its own network namespace (inside its user namespace)."""
    return any(
        ns.get("type") == "network" and not ns.get("path")
        for ns in oci.get("linux", {}).get("namespaces", [])
    )


def with_user_namespace(oci: dict[str, Any], ids: IdRange) -> dict[str, Any]:
    """``oci`` with a user namespace mapping ``ids`` to ``[0, size)``."""
    out = copy.deepcopy(oci)
    linux = out.setdefault("linux", {})
    mapping = [{"containerID": 0, "hostID": ids.first, "size": ids.size}]
    linux["uidMappings"] = mapping
    linux["gidMappings"] = copy.deepcopy(mapping)
    namespaces = linux.setdefault("namespaces", [])
    if not any(ns.get("type") == "user" for ns in namespaces):
        namespaces.append({"type": "user"})
    if not _owns_network(out):
        # sysfs may be mounted only by the owner of the network namespace.
        for mount in out.get("mounts", []):
            if mount.get("type") == "sysfs":
                options = [o for o in mount.get("options", []) if o not in ("rw", "ro")]
                read_only = "rw" not in mount.get("options", [])
                mount.update(
                    type="bind",
                    source="/sys",
                    options=["rbind", "nosuid", "noexec", "nodev", "ro" if read_only else "rw"]
                    + [o for o in options if o not in ("nosuid", "noexec", "nodev")],
                )
    return out


__all__ = [
    "FIRST_ID",
    "LAST_ID",
    "RANGE_SIZE",
    "IdRange",
    "NoFreeRange",
    "pick_range",
    "with_user_namespace",
]
