"""What a node's kernel offers a sandbox beyond namespaces and seccomp, and what the
agent does with it: pure, from facts the agent probes once at start-up.

- **AppArmor**: where the kernel has AppArmor enabled, every unprivileged sandbox
  runs under the configured profile (containerd's CRI default is
  ``cri-containerd.apparmor.d``). A profile that is not loaded fails the start
  closed (runc would refuse it anyway, with a less useful message); the profile
  setting set to ``""`` opts out on purpose. Where the kernel has no AppArmor
  there is nothing to apply, as under containerd.
- **User namespaces** (``spec.hostUsers: false``): the sandbox's root is an
  unprivileged range of host IDs (``policy.userns``) and its root filesystem is
  owned by that range. A node whose kernel lets no process make a user namespace
  (``user.max_user_namespaces`` is 0) refuses such a sandbox with a reason, and
  never runs it with the node's users.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandlot.api.reasons import SandboxReason


class IsolationUnavailable(ValueError):
    """The sandbox asks for, or the node requires, isolation this node cannot give."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class NodeSecurity:
    """Probed once per agent."""

    apparmor_profiles: frozenset[str] | None = None
    """Profiles the kernel has loaded; None when the kernel has no AppArmor enabled."""
    kernel: tuple[int, int] | None = None
    """(major, minor) of the node's kernel; None when unknown."""
    user_namespaces: bool | None = None
    """Whether the kernel lets a process make user namespaces; None when unknown."""


def apparmor_profile(node: NodeSecurity, wanted: str, *, privileged: bool) -> str | None:
    """The ``process.apparmorProfile`` of a sandbox, or None for none."""
    if privileged or not wanted or node.apparmor_profiles is None:
        return None
    if wanted not in node.apparmor_profiles:
        raise IsolationUnavailable(
            SandboxReason.APPARMOR_PROFILE_MISSING,
            f"AppArmor is enabled on this node but the profile {wanted!r} is not loaded: "
            "load it (apparmor_parser) or set the agent's apparmorProfile",
        )
    return wanted


def check_user_namespace(node: NodeSecurity, host_users: bool | None) -> None:
    """Raise ``IsolationUnavailable`` for ``hostUsers: false`` on a node whose kernel
    makes no user namespaces. Unknown is tried: runc's refusal names the cause."""
    if host_users is not False or node.user_namespaces is not False:
        return
    raise IsolationUnavailable(
        SandboxReason.USER_NAMESPACES_UNSUPPORTED,
        "spec.hostUsers: false asks for a user namespace, but the node's kernel allows "
        "none (sysctl user.max_user_namespaces is 0); remove hostUsers or run it on a "
        "node that allows them",
    )


__all__ = [
    "IsolationUnavailable",
    "NodeSecurity",
    "apparmor_profile",
    "check_user_namespace",
]
