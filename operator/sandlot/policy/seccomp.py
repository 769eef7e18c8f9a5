"""The seccomp profile of every unprivileged sandbox, as plain data.

Choice: **allow by default, deny a fixed list** (``SCMP_ACT_ALLOW`` plus
``SCMP_ACT_ERRNO`` rules), rather than containerd's/Docker's allow-list of some
350 calls. The allow-list also refuses syscalls newer than the profile, which is
stronger, but a hand-kept copy of it drifts and breaks ordinary programs in ways
that are hard to see; the deny-list below is short enough to review line by line
and covers what RuntimeDefault exists to stop: the calls that reach into the
kernel or the host instead of the sandbox. Each group says why.

Calls are refused with EPERM, as the default profiles do, so programs see "not
permitted" rather than a crash. ``clone3`` answers ENOSYS instead: its flags sit
in a struct the filter cannot read, and ENOSYS makes libc fall back to ``clone``,
whose flags it can (the same trick Docker's profile uses).

Architectures: the native one and its compat ABIs are listed so a 32-bit
syscall number cannot slip past a rule written for the 64-bit one; any other
architecture is killed by libseccomp's bad-arch action.
"""

from __future__ import annotations

import platform
from typing import Any

EPERM = 1
ENOSYS = 38
# clone(2) flags that create namespaces (linux/sched.h).
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
)

DENIED: dict[str, tuple[str, ...]] = {
    # Loading code into the kernel, or replacing it.
    "kernel modules": (
        "init_module",
        "finit_module",
        "delete_module",
        "create_module",
        "query_module",
        "get_kernel_syms",
    ),
    "kexec": ("kexec_load", "kexec_file_load"),
    "bpf and perf (kernel attack surface, reads other processes)": ("bpf", "perf_event_open"),
    # Filesystem topology: a sandbox sees only the mounts it was given.
    "mounts": (
        "mount",
        "umount",
        "umount2",
        "pivot_root",
        "move_mount",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "open_tree",
        "mount_setattr",
    ),
    # New namespaces (a user namespace hands out capabilities inside it and opens
    # kernel paths meant for root); clone() with these flags is refused below.
    "namespaces": ("unshare", "setns"),
    # The kernel keyring is not namespaced: keys would be shared with the host.
    "keyring": ("keyctl", "add_key", "request_key"),
    # Reading or writing other processes' memory.
    "tracing": (
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "kcmp",
        "pidfd_getfd",
        "userfaultfd",
    ),
    # Node-wide state: the clock, swap, accounting, the machine's power.
    "clock": ("settimeofday", "clock_settime", "clock_settime64", "clock_adjtime", "stime"),
    "node state": (
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "syslog",
        "vhangup",
        "quotactl",
        "quotactl_fd",
        "nfsservctl",
        "_sysctl",
        "sysfs",
        "ustat",
        "uselib",
        "lookup_dcookie",
        "fanotify_init",
    ),
    # Handles bypass path checks (the "shocker" escape used open_by_handle_at).
    "file handles": ("open_by_handle_at",),
    # Raw I/O ports and legacy virtual-8086 mode.
    "hardware": ("iopl", "ioperm", "vm86", "vm86old"),
    # NUMA page moves across processes.
    "memory placement": ("move_pages", "migrate_pages"),
    # io_uring has been a steady source of kernel escalations; RuntimeDefault
    # profiles refuse it too.
    "io_uring": ("io_uring_setup", "io_uring_enter", "io_uring_register"),
}

ARCHITECTURES = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
}


def denied_syscalls() -> list[str]:
    return sorted({name for group in DENIED.values() for name in group})


def default_profile(machine: str | None = None) -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object for an unprivileged sandbox."""
    arch = (machine or platform.machine()).lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": list(ARCHITECTURES.get(arch, ())),
        "syscalls": [
            {"names": denied_syscalls(), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
            # clone(flags, ...) with any namespace flag -> EPERM: one rule per flag,
            # since rules OR and a masked compare can only test equality. Argument 0
            # on x86 and arm (s390x, which swaps the first two, is not supported).
            *(
                {
                    "names": ["clone"],
                    "action": "SCMP_ACT_ERRNO",
                    "errnoRet": EPERM,
                    "args": [
                        {"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}
                    ],
                }
                for flag in NAMESPACE_FLAGS
            ),
        ],
    }
