"""A default OCI runtime spec for a Linux sandbox container, as a plain dict.

This is the baseline containerd's own client would produce (the same mounts,
namespaces, masked paths and default capability set), written as a pure
function so it can be tested and hardened (capabilities, seccomp) in one place.
The containerd adapter adds only ``root.path``; everything else comes from here
or from the caller's changes to the returned dict.

Works on cgroup v1 and v2: runc interprets ``cgroupsPath`` for either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OCI_VERSION = "1.0.2"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CGROUP_PARENT = "/sandlot"

# containerd's default set for unprivileged containers (oci.defaultUnixCaps).
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)

MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
)
READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)


def _mounts() -> list[dict[str, Any]]:
    return [
        {
            "destination": "/proc",
            "type": "proc",
            "source": "proc",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        {
            "destination": "/run",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
    ]


def default_spec(
    args: Sequence[str],
    env: Sequence[str],
    cwd: str,
    *,
    host_network: bool,
    hostname: str,
    user: tuple[int, int] = (0, 0),
    cgroups_path: str | None = None,
) -> dict[str, Any]:
    """The OCI spec to run ``args`` in its own pid/ipc/uts/mount (and network) namespaces.

    ``host_network`` leaves out the network namespace (the container shares the
    node's). ``cgroups_path`` defaults to ``/sandlot/<hostname>``. ``env`` gets a
    default ``PATH`` when it sets none.
    """
    if not args:
        raise ValueError("a container needs a command (args is empty)")
    environment = list(env)
    if not any(item.startswith("PATH=") for item in environment):
        environment.insert(0, DEFAULT_PATH)
    namespaces = [{"type": kind} for kind in ("pid", "ipc", "uts", "mount")]
    if not host_network:
        namespaces.append({"type": "network"})
    uid, gid = user
    caps = list(DEFAULT_CAPABILITIES)
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": list(args),
            "env": environment,
            "cwd": cwd or "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": hostname,
        "mounts": _mounts(),
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": cgroups_path
            if cgroups_path is not None
            else f"{CGROUP_PARENT}/{hostname}",
            "resources": {"devices": [{"allow": False, "access": "rwm"}]},
            "maskedPaths": list(MASKED_PATHS),
            "readonlyPaths": list(READONLY_PATHS),
        },
    }
