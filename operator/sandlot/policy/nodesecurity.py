"""What a node's kernel offers a sandbox beyond namespaces and seccomp, and what the
agent does with it: pure, from facts the agent probes once at start-up.

- **AppArmor**: where the kernel has AppArmor enabled, every unprivileged sandbox
  runs under the configured profile (containerd's CRI default is
  ``cri-containerd.apparmor.d``). A profile that is not loaded fails the start
  closed (runc would refuse it anyway, with a less useful message); the profile
  setting set to ``""`` opts out on purpose. Where the kernel has no AppArmor
  there is nothing to apply, as under containerd.
- **User namespaces** (``spec.hostUsers: false``): they need the root filesystem
  mounted through an idmapped mount, which this agent does not set up yet; such a
  sandbox is refused with a reason that says so and what the kernel offers, never
  run silently with host users.
"""

from __future__ import annotations

from dataclasses import dataclass

# Linux 5.12 brought idmapped mounts; overlayfs (the snapshotter's) took them in 5.19.
IDMAPPED_OVERLAY_KERNEL = (5, 19)


class IsolationUnavailable(ValueError):
    """The sandbox asks for, or the node requires, isolation this node cannot give."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


REASON_APPARMOR_MISSING = "AppArmorProfileMissing"
REASON_USER_NAMESPACES = "UserNamespacesUnsupported"


@dataclass(frozen=True)
class NodeSecurity:
    """Probed once per agent."""

    apparmor_profiles: frozenset[str] | None = None
    """Profiles the kernel has loaded; None when the kernel has no AppArmor enabled."""
    kernel: tuple[int, int] | None = None
    """(major, minor) of the node's kernel; None when unknown."""


def apparmor_profile(node: NodeSecurity, wanted: str, *, privileged: bool) -> str | None:
    """The ``process.apparmorProfile`` of a sandbox, or None for none."""
    if privileged or not wanted or node.apparmor_profiles is None:
        return None
    if wanted not in node.apparmor_profiles:
        raise IsolationUnavailable(
            REASON_APPARMOR_MISSING,
            f"AppArmor is enabled on this node but the profile {wanted!r} is not loaded: "
            "load it (apparmor_parser) or set the agent's apparmorProfile",
        )
    return wanted


def check_user_namespace(node: NodeSecurity, host_users: bool | None) -> None:
    """Raise ``IsolationUnavailable`` for ``hostUsers: false``, naming why."""
    if host_users is not False:
        return
    if node.kernel is None or node.kernel < IDMAPPED_OVERLAY_KERNEL:
        kernel = ".".join(map(str, node.kernel)) if node.kernel else "unknown"
        why = f"the node's kernel ({kernel}) has no idmapped overlay mounts (5.19 or later)"
    else:
        why = "this agent does not map a sandbox's root filesystem through an idmapped mount"
    raise IsolationUnavailable(
        REASON_USER_NAMESPACES,
        f"spec.hostUsers: false asks for a user namespace, but {why}; "
        "remove hostUsers or run it on a node that supports it",
    )


__all__ = [
    "REASON_APPARMOR_MISSING",
    "REASON_USER_NAMESPACES",
    "IsolationUnavailable",
    "NodeSecurity",
    "apparmor_profile",
    "check_user_namespace",
]
