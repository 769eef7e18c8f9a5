"""The OCI runtime spec of a sandbox container, as a plain dict: pure, so every
default and every field a Sandbox sets is tested without a runtime.

``default_spec`` starts from what containerd's own client would produce (the same mounts,
namespaces, masked and read-only paths) and hardens it: a smaller capability
baseline, a seccomp profile, a pids limit. A pure function, so every default is
tested and documented in one place (docs/isolation.md).
The containerd adapter adds only ``root.path``; everything else comes from here
or from the caller's changes to the returned dict. ``build_oci_spec`` puts a
Sandbox's spec (command, env, user, limits, security context) and its image's
config on top; what runc and the kernel make of it is claimed against the real
ones in tests/integration/test_isolation_sandbox.py.

Works on cgroup v1 and v2: runc interprets ``cgroupsPath`` for either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandlot.api.admission import cap_name
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.imageuser import ResolvedUser, resolve_user
from sandlot.policy.limits import check_limits
from sandlot.policy.quantity import CFS_PERIOD_US, cpu_quota, memory_bytes
from sandlot.policy.seccomp import default_profile

OCI_VERSION = "1.0.2"
DEFAULT_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CGROUP_PARENT = "/sandlot"

# The baseline every unprivileged sandbox gets: containerd's and Docker's default
# set minus the capabilities that matter only for attacks or for device and raw
# network work (dropped: NET_RAW - forged packets, ARP/DNS spoofing on the node's
# network; MKNOD - device nodes; SETFCAP - file capabilities that grant privileges
# on exec; SETPCAP - reshaping other capability sets; AUDIT_WRITE - the host's
# audit log). Each of those may be added back with securityContext.capabilities.add
# where the namespace's level allows it.
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN",  # chown files in its own root filesystem
    "CAP_DAC_OVERRIDE",  # root ignores file modes, as images expect
    "CAP_FOWNER",  # chmod/utime files it does not own
    "CAP_FSETID",  # keep setgid bits when chmodding
    "CAP_KILL",  # signal its own processes of other UIDs
    "CAP_SETGID",  # drop to another group (su, package managers, daemons)
    "CAP_SETUID",  # drop to another user
    "CAP_NET_BIND_SERVICE",  # listen on ports below 1024
    "CAP_SYS_CHROOT",  # chroot inside its own filesystem
)

# Every capability, by bit number (linux/capability.h): `privileged` gets them all.
ALL_CAPABILITIES = tuple(
    f"CAP_{name}"
    for name in [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ]
)
DEFAULT_PIDS_LIMIT = 1024


def cgroups_path_for(name: str, parent: str = CGROUP_PARENT) -> str:
    """The cgroup (relative to each hierarchy's root) of the container ``name``."""
    return f"{parent.rstrip('/')}/{name}"


def network_namespace_path(spec: Mapping[str, Any]) -> str | None:
    """The named network namespace a container's spec joins (one its agent made,
    for CNI or a loopback of its own), else None: runc makes a fresh one, or the
    container shares the node's."""
    for ns in (spec.get("linux") or {}).get("namespaces") or ():
        if ns.get("type") == "network":
            return str(ns.get("path") or "") or None
    return None


def in_cgroup(proc_cgroup: str, cgroups_path: str) -> bool:
    """Whether a process whose ``/proc/<pid>/cgroup`` reads ``proc_cgroup`` is in
    the cgroup ``cgroups_path`` (a container spec's ``linux.cgroupsPath``). The
    file names each hierarchy's path as the reader's cgroup namespace sees it, so
    only its end is compared, on a whole path segment."""
    want = "/" + cgroups_path.strip("/")
    if want == "/":
        return False
    for line in proc_cgroup.splitlines():
        path = line.split(":", 2)[-1].rstrip("/")
        if path == want or path.endswith(want):
            return True
    return False


def capability_mask(names: Sequence[str]) -> int:
    """The kernel's bitmask of a capability set (as /proc/PID/status prints it)."""
    return sum(1 << ALL_CAPABILITIES.index(n) for n in set(names))


# containerd's (and the kubelet's) default masked and read-only paths, in its order.
MASKED_PATHS = (
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/proc/scsi",
)
READONLY_PATHS = (
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
)


# Where the files tool (operator/filetool) is in a sandbox (``runtimeclass.
# with_files_tool``): a file under the container's own /dev tmpfs, so no commit of
# its root filesystem carries it, bind-mounted read-only, so the sandbox cannot
# change what the agent runs in it.
FILES_TOOL = "/dev/.sandlot/files"
# The executor (operator/executor) beside it, mounted the same way
# (``runtimeclass.with_executor``).
EXECUTOR = "/dev/.sandlot/exec"


def _mounts(*, privileged: bool = False) -> list[dict[str, Any]]:
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
            "options": ["nosuid", "noexec", "nodev", "rw" if privileged else "ro"],
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
    additional_gids: Sequence[int] = (),
    cgroups_path: str,
    capabilities: Sequence[str] = DEFAULT_CAPABILITIES,
    privileged: bool = False,
    readonly_root: bool = False,
    pids_limit: int = DEFAULT_PIDS_LIMIT,
) -> dict[str, Any]:
    """The OCI spec to run ``args`` in its own pid/ipc/uts/mount (and network) namespaces.

    Safe by default: the baseline capabilities, ``noNewPrivileges``, the seccomp
    profile of ``sandlot.policy.seccomp``, masked and read-only ``/proc`` and
    ``/sys`` paths, no host mounts, devices denied, at most ``pids_limit``
    processes. ``privileged`` drops the seccomp filter and the
    masked and read-only paths and mounts ``/sys`` writable; pair it with
    ``capabilities`` naming every capability the node has (runc refuses one
    outside its own bounding set). The sandbox then owns the node: only a
    namespace at level ``privileged`` may ask for it.

    ``host_network`` leaves out the network namespace (the container shares the
    node's). ``cgroups_path`` names the container's cgroup: one per container, since
    runc refuses to create a task in a cgroup another container has frozen. ``env``
    gets a default ``PATH`` when it sets none.
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
    caps = list(dict.fromkeys(capabilities))
    resources: dict[str, Any] = {
        "devices": [{"allow": False, "access": "rwm"}],
        "pids": {"limit": pids_limit},
    }
    linux: dict[str, Any] = {
        "namespaces": namespaces,
        "cgroupsPath": cgroups_path,
        "resources": resources,
    }
    if not privileged:
        linux["maskedPaths"] = list(MASKED_PATHS)
        linux["readonlyPaths"] = list(READONLY_PATHS)
        linux["seccomp"] = default_profile(caps)
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": {
                "uid": uid,
                "gid": gid,
                **({"additionalGids": list(additional_gids)} if additional_gids else {}),
            },
            "args": list(args),
            "env": environment,
            "cwd": cwd or "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": readonly_root},
        "hostname": hostname,
        "mounts": _mounts(privileged=privileged),
        "linux": linux,
    }


# ------------------------------------------------------------------ a Sandbox's spec


@dataclass(frozen=True)
class ImageConfig:
    """What the OCI image config says about how to run it."""

    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ()
    working_dir: str = ""
    user: str = ""
    # The image's /etc/passwd and /etc/group, read only when ``user`` names a user
    # or group (``imageuser.needs_lookup``).
    passwd: str = ""
    group: str = ""


class RunAsRootRefused(ValueError):
    """``runAsNonRoot`` is set and the process would run as UID 0."""


def process_user(spec: SandboxSpec, config: ImageConfig) -> ResolvedUser:
    """The security context's UID/GID, else the image's ``user`` resolved through its
    own ``/etc/passwd`` and ``/etc/group``, else root. Raises ``UnknownImageUser``."""
    ctx = spec.security_context
    uid = ctx.run_as_user if ctx and ctx.run_as_user is not None else None
    gid = ctx.run_as_group if ctx and ctx.run_as_group is not None else None
    if uid is None and config.user:
        image = resolve_user(config.user, config.passwd, config.group)
        return ResolvedUser(image.uid, image.gid if gid is None else gid, image.additional_gids)
    group = config.user.partition(":")[2]
    if gid is None and group.isdigit():
        gid = int(group)
    return ResolvedUser(uid or 0, gid if gid is not None else 0)


def sandbox_capabilities(spec: SandboxSpec, node_capabilities: Sequence[str]) -> list[str]:
    """The baseline plus ``capabilities.add``; every capability of the node when
    ``privileged`` or when ``ALL`` is added."""
    ctx = spec.security_context
    adds = list(ctx.capabilities.add) if ctx and ctx.capabilities else []
    if (ctx and ctx.privileged) or any(cap_name(c) == "ALL" for c in adds):
        return list(node_capabilities)
    return list(dict.fromkeys([*DEFAULT_CAPABILITIES, *(f"CAP_{cap_name(c)}" for c in adds)]))


def build_oci_spec(
    name: str,
    spec: SandboxSpec,
    config: ImageConfig,
    *,
    hostname: str,
    pids_limit: int = DEFAULT_PIDS_LIMIT,
    limit_swap: bool = False,
    node_capabilities: Sequence[str] = ALL_CAPABILITIES,
    apparmor_profile: str | None = None,
    cgroup_parent: str = CGROUP_PARENT,
    env: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The OCI spec for a Sandbox: its command (or the image's), env, user, limits and
    security context, on top of ``default_spec``'s safe defaults.

    ``limit_swap`` sets memory+swap to the memory limit (no swap beyond it); only
    where the node's kernel accounts swap, since runc refuses it on cgroup v1
    otherwise. ``node_capabilities`` is what ``privileged`` (or adding ``ALL``)
    grants: every capability the node's runtime can hand out. Raises
    ``RunAsRootRefused`` when ``runAsNonRoot`` meets UID 0, ``LimitRefused`` for a
    limit below its floor (runc would read a memory limit of 0 as none), and
    ``ValueError`` for a spec that cannot run at all (no command, a limit that is
    not a quantity). ``env``: the spec's variables as ``NAME=value`` with its
    references resolved (``policy.envrefs``); default its plain values.
    """
    check_limits(spec, pids_limit, required=False)
    args = list(spec.command) or [*config.entrypoint, *config.cmd]
    if not args:
        raise ValueError(f"image {spec.image} has no entrypoint or cmd and spec.command is empty")
    own = env if env is not None else [f"{e.name}={e.value}" for e in spec.env]
    variables = [*config.env, *own]
    ctx = spec.security_context
    user = process_user(spec, config)
    if ctx and ctx.run_as_non_root and user.uid == 0:
        source = "spec.securityContext.runAsUser" if ctx.run_as_user == 0 else "the image"
        raise RunAsRootRefused(
            f"spec.securityContext.runAsNonRoot is true but the process would run as UID 0 "
            f"(from {source}): set spec.securityContext.runAsUser to a non-zero UID"
        )
    oci = default_spec(
        args,
        variables,
        config.working_dir,
        host_network=spec.host_network,
        hostname=hostname[:63],
        user=(user.uid, user.gid),
        additional_gids=user.additional_gids,
        cgroups_path=cgroups_path_for(name, cgroup_parent),
        capabilities=sandbox_capabilities(spec, node_capabilities),
        privileged=bool(ctx and ctx.privileged),
        readonly_root=bool(ctx and ctx.read_only_root_filesystem),
        pids_limit=pids_limit,
    )
    if apparmor_profile:
        oci["process"]["apparmorProfile"] = apparmor_profile
    limits = spec.resources.limits if spec.resources else None
    resources = oci["linux"]["resources"]
    if limits and limits.memory:
        memory = memory_bytes(limits.memory)
        resources["memory"] = {"limit": memory, **({"swap": memory} if limit_swap else {})}
    if limits and limits.cpu:
        resources["cpu"] = {"quota": cpu_quota(limits.cpu), "period": CFS_PERIOD_US}
    return oci
