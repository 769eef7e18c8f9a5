"""What the agent reads, besides Sandboxes, to keep a sandbox inside its fence.

- ``namespace_metadata``: the policy level of a Sandbox's namespace is a label on
  the Namespace (``sandlot.dev/enforce``), its default limits an annotation; a
  start reads both at once. Needs ``get`` on ``namespaces``.
- ``oom_kills``: an exit code of 137 says SIGKILL, not who sent it. The kernel
  counts the OOM kills of each memory cgroup (``memory.oom_control`` on cgroup v1,
  ``memory.events`` on v2); the agent reads the counter of a container's cgroup
  after its task exited and before the teardown removes the cgroup.
- ``bounding_capabilities``: what ``privileged`` can be given is the node's
  bounding set (runc fails to start a container asking for more).
- ``apparmor_profiles``: whether the kernel has AppArmor enabled, and which
  profiles it has loaded (``/sys/kernel/security/apparmor/profiles``).
- ``swap_accounted``: on cgroup v1 runc refuses a memory+swap limit when the
  kernel does not account swap; on v2 it ignores it. Probed once per agent.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

from sandlot.adapters.mergepatch import MergePatcher

CALL_TIMEOUT = 10.0


def namespace_metadata(patcher: MergePatcher, name: str) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and the annotations of Namespace ``name``, from one lean read (raises
    the API's exception when unreadable)."""
    ns = patcher.read("api", "v1", "namespaces", name, timeout=CALL_TIMEOUT)
    meta = ns.get("metadata") or {}
    return dict(meta.get("labels") or {}), dict(meta.get("annotations") or {})


def namespace_annotations(api: client.ApiClient, name: str) -> dict[str, str]:
    """The annotations of Namespace ``name`` (raises the API's exception when unreadable)."""
    ns: Any = client.CoreV1Api(api).read_namespace(name, _request_timeout=CALL_TIMEOUT)
    return dict(ns.metadata.annotations or {})


def kubernetes_node_taints(api: client.ApiClient, name: str) -> list[dict[str, str]] | None:
    """The taints of the Kubernetes Node ``name``; None when it cannot be read (no such
    Node, or no ``get`` on ``nodes``)."""
    try:
        node: Any = client.CoreV1Api(api).read_node(name, _request_timeout=CALL_TIMEOUT)
    except Exception:
        return None
    return [
        {"key": t.key, "value": t.value or "", "effect": t.effect}
        for t in (node.spec.taints or [])
        if t.key and t.effect
    ]


def user_namespaces_allowed(
    sysctl: str | Path = "/proc/sys/user/max_user_namespaces",
) -> bool | None:
    """Whether the kernel lets processes make user namespaces; None when unknown."""
    try:
        return int(Path(sysctl).read_text().strip()) > 0
    except (OSError, ValueError):
        return None


def node_memory_bytes(meminfo: str | Path = "/proc/meminfo") -> int | None:
    """The node's memory (MemTotal), or None when unreadable."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def filesystem_bytes(path: str | Path) -> int | None:
    """The size of the filesystem holding ``path``, or None when it cannot be read."""
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def cgroup_v2(root: str | Path) -> bool:
    return (Path(root) / "cgroup.controllers").exists()


def pid_max(path: str | Path = "/proc/sys/kernel/pid_max") -> int | None:
    """The kernel's highest PID (the node's PID space), or None when unreadable."""
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def limit_cgroup(root: str | Path, cgroups_path: str, *, memory: int, pids: int) -> None:
    """Create the cgroup ``cgroups_path`` (as runc names it) and write its hard memory
    and pids limits, on cgroup v1 or v2; ``OSError`` when the filesystem refuses."""
    relative = cgroups_path.strip("/")
    if cgroup_v2(root):
        directory = Path(root) / relative
        directory.mkdir(parents=True, exist_ok=True)
        # Each level above must hand the controllers down for the files to exist.
        level = Path(root)
        for part in Path(relative).parts:
            (level / "cgroup.subtree_control").write_text("+memory +pids")
            level = level / part
        (directory / "memory.max").write_text(str(memory))
        (directory / "pids.max").write_text(str(pids))
        return
    for controller, name, value in (
        ("memory", "memory.limit_in_bytes", memory),
        ("pids", "pids.max", pids),
    ):
        directory = Path(root) / controller / relative
        directory.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(str(value))


def _counter(text: str, key: str) -> int | None:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return None


def oom_kills(root: str | Path, cgroups_path: str) -> int | None:
    """OOM kills recorded in the memory cgroup ``cgroups_path``; None when unknown."""
    relative = cgroups_path.lstrip("/")
    if cgroup_v2(root):
        candidates = [Path(root) / relative / "memory.events"]
    else:
        candidates = [Path(root) / "memory" / relative / "memory.oom_control"]
    for path in candidates:
        try:
            return _counter(path.read_text(), "oom_kill")
        except OSError:
            continue
    return None


def apparmor_profiles(sys_root: str | Path = "/sys") -> frozenset[str] | None:
    """Loaded AppArmor profile names; None when the kernel has AppArmor off or absent."""
    root = Path(sys_root)
    try:
        enabled = (root / "module/apparmor/parameters/enabled").read_text().strip()
    except OSError:
        return None
    if enabled != "Y":
        return None
    try:
        text = (root / "kernel/security/apparmor/profiles").read_text()
    except OSError:
        return frozenset()  # enabled, but securityfs is not visible: nothing provably loaded
    return frozenset(line.rsplit(" (", 1)[0] for line in text.splitlines() if line.strip())


def swap_accounted(root: str | Path) -> bool:
    """Whether a memory+swap limit can be set (always true on v2, where runc copes)."""
    if cgroup_v2(root):
        return True
    return (Path(root) / "memory" / "memory.memsw.limit_in_bytes").exists()


def bounding_capabilities(
    by_bit: Sequence[str], status: str | Path = "/proc/self/status"
) -> tuple[str, ...]:
    """The names (``by_bit[n]`` is bit n) in this process's capability bounding set."""
    try:
        text = Path(status).read_text()
    except OSError:
        return tuple(by_bit)
    for line in text.splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
            return tuple(name for bit, name in enumerate(by_bit) if mask >> bit & 1)
    return tuple(by_bit)
