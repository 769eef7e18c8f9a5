"""The seccomp profile of every unprivileged sandbox, as plain data.

An **allow-list equal in effect to containerd's RuntimeDefault**
(``contrib/seccomp/seccomp_default.go``, transcribed rule by rule below): every
syscall not allowed is refused with EPERM, so a syscall newer than the profile is
refused too, as under the kubelet's ``RuntimeDefault``. The conditions containerd
puts on rules are kept as data: rules by architecture, by kernel version, and by
the capabilities in the bounding set (a sandbox granted ``CAP_SYS_TIME`` may set
the clock, as it could under containerd).

Stricter than containerd in three places, each a grant that would let a sandbox
reach the node rather than itself (``WITHHELD``):

- ``CAP_SYS_ADMIN`` and ``CAP_SYS_MODULE`` added to a non-privileged sandbox do
  not open ``mount``/``unshare``/``setns``/``bpf`` or module loading: a sandbox
  that needs those is ``privileged`` (no filter at all), in a namespace whose level
  says so.
- ``ptrace`` and ``process_vm_readv``/``writev`` stay refused without
  ``CAP_SYS_PTRACE`` even on kernels >= 4.8 (where containerd allows them): the
  sandbox's processes cannot inspect one another, and tracing is a capability a
  namespace grants explicitly.

``clone`` is allowed only without namespace flags (a masked compare of argument
0; s390x swaps the first two arguments and is not supported), and ``clone3``
answers ENOSYS: its flags sit in a struct the filter cannot read, and ENOSYS makes
libc fall back to ``clone``, whose flags it can. ``socket`` is allowed for every
address family except ``AF_ALG`` (the kernel crypto API) and ``AF_VSOCK`` (the
hypervisor channel). ``personality`` only with the values ordinary programs use
(0, PER_LINUX32, UNAME26 and the query 0xffffffff): never ``ADDR_NO_RANDOMIZE``.

Architectures: the native one and its compat ABIs are listed so a 32-bit syscall
number cannot slip past a rule written for the 64-bit one; any other architecture
is killed by libseccomp's bad-arch action. Names the node's libseccomp does not
know are skipped by runc, so the list may name syscalls of newer kernels.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

EPERM = 1
ENOSYS = 38
AF_ALG = 38
AF_VSOCK = 40
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
NAMESPACE_MASK = sum(NAMESPACE_FLAGS)

# containerd's unconditional allow rule, in its order.
# fmt: off
ALLOWED: tuple[str, ...] = (
    "accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "cachestat", "capget",
    "capset", "chdir", "chmod", "chown", "chown32", "clock_adjtime", "clock_adjtime64",
    "clock_getres", "clock_getres_time64", "clock_gettime", "clock_gettime64",
    "clock_nanosleep", "clock_nanosleep_time64", "close", "close_range", "connect",
    "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create", "epoll_create1",
    "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2", "epoll_wait", "epoll_wait_old",
    "eventfd", "eventfd2", "execve", "execveat", "exit", "exit_group", "faccessat",
    "faccessat2", "fadvise64", "fadvise64_64", "fallocate", "fanotify_mark", "fchdir", "fchmod",
    "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat", "fcntl", "fcntl64", "fdatasync",
    "fgetxattr", "flistxattr", "flock", "fork", "fremovexattr", "fsetxattr", "fstat", "fstat64",
    "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate", "ftruncate64", "futex",
    "futex_requeue", "futex_time64", "futex_wait", "futex_waitv", "futex_wake", "futimesat",
    "getcpu", "getcwd", "getdents", "getdents64", "getegid", "getegid32", "geteuid",
    "geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer", "getpeername",
    "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrandom", "getresgid",
    "getresgid32", "getresuid", "getresuid32", "getrlimit", "get_robust_list", "getrusage",
    "getsid", "getsockname", "getsockopt", "get_thread_area", "gettid", "gettimeofday",
    "getuid", "getuid32", "getxattr", "getxattrat", "inotify_add_watch", "inotify_init",
    "inotify_init1", "inotify_rm_watch", "io_cancel", "ioctl", "io_destroy", "io_getevents",
    "io_pgetevents", "io_pgetevents_time64", "ioprio_get", "ioprio_set", "io_setup",
    "io_submit", "ipc", "kill", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self", "lchown", "lchown32", "lgetxattr", "link", "linkat", "listen",
    "listmount", "listxattr", "listxattrat", "llistxattr", "_llseek", "lremovexattr", "lseek",
    "lsetxattr", "lsm_get_self_attr", "lsm_list_modules", "lsm_set_self_attr", "lstat",
    "lstat64", "madvise", "membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir",
    "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "map_shadow_stack", "mmap",
    "mmap2", "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
    "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap",
    "mseal", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock", "munlockall", "munmap",
    "name_to_handle_at", "nanosleep", "newfstatat", "_newselect", "open", "openat", "openat2",
    "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64", "preadv", "preadv2",
    "prlimit64", "process_mrelease", "pselect6", "pselect6_time64", "pwrite64", "pwritev",
    "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "recv", "recvfrom",
    "recvmmsg", "recvmmsg_time64", "recvmsg", "remap_file_pages", "removexattr",
    "removexattrat", "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq",
    "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
    "rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
    "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
    "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr", "sched_setparam",
    "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl", "semget", "semop",
    "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64", "sendmmsg", "sendmsg",
    "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
    "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
    "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32",
    "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area",
    "set_tid_address", "setuid", "setuid32", "setxattr", "setxattrat", "shmat", "shmctl",
    "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask",
    "sigreturn", "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64",
    "statmount", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs",
    "sysinfo", "tee", "tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun",
    "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create",
    "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times",
    "tkill", "truncate", "truncate64", "ugetrlimit", "umask", "uname", "unlink", "unlinkat",
    "uretprobe", "utime", "utimensat", "utimensat_time64", "utimes", "vfork", "vmsplice",
    "wait4", "waitid", "waitpid", "write", "writev",
)
# fmt: on

# personality(2) values allowed: PER_LINUX, PER_LINUX32, UNAME26, both, and the query.
PERSONALITIES = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)

# Allowed from a kernel version on, as containerd does: (major, minor) -> names.
BY_KERNEL: dict[tuple[int, int], tuple[str, ...]] = {
    (4, 8): ("process_vm_readv", "process_vm_writev", "ptrace"),
}

# Allowed on an architecture (``platform.machine()`` spelling).
BY_ARCH: dict[str, tuple[str, ...]] = {
    "x86_64": ("arch_prctl", "modify_ldt"),
    "aarch64": (
        "arm_fadvise64_64",
        "arm_sync_file_range",
        "sync_file_range2",
        "breakpoint",
        "cacheflush",
        "set_tls",
    ),
    "ppc64le": ("sync_file_range2", "swapcontext"),
    "s390x": ("s390_pci_mmio_read", "s390_pci_mmio_write", "s390_runtime_instr"),
    "riscv64": ("riscv_flush_icache", "riscv_hwprobe"),
}

# Allowed when the capability is in the bounding set.
BY_CAPABILITY: dict[str, tuple[str, ...]] = {
    "CAP_DAC_READ_SEARCH": ("open_by_handle_at",),
    "CAP_SYS_ADMIN": (
        "bpf",
        "clone",
        "clone3",
        "fanotify_init",
        "fsconfig",
        "fsmount",
        "fsopen",
        "fspick",
        "lookup_dcookie",
        "mount",
        "mount_setattr",
        "move_mount",
        "open_tree",
        "perf_event_open",
        "quotactl",
        "quotactl_fd",
        "setdomainname",
        "sethostname",
        "setns",
        "syslog",
        "umount",
        "umount2",
        "unshare",
    ),
    "CAP_SYS_BOOT": ("reboot",),
    "CAP_SYS_CHROOT": ("chroot",),
    "CAP_SYS_MODULE": ("delete_module", "init_module", "finit_module"),
    "CAP_SYS_PACCT": ("acct",),
    "CAP_SYS_PTRACE": (
        "kcmp",
        "pidfd_getfd",
        "process_madvise",
        "process_vm_readv",
        "process_vm_writev",
        "ptrace",
    ),
    "CAP_SYS_RAWIO": ("iopl", "ioperm"),
    "CAP_SYS_TIME": ("settimeofday", "stime", "clock_settime", "clock_settime64"),
    "CAP_SYS_TTY_CONFIG": ("vhangup",),
    "CAP_SYS_NICE": ("get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"),
    "CAP_SYSLOG": ("syslog",),
    "CAP_BPF": ("bpf",),
    "CAP_PERFMON": ("perf_event_open",),
}

# containerd's grants sandlot does not make (see the module docstring): capability
# names and kernel versions whose rules are left out.
WITHHELD_CAPABILITIES = frozenset({"CAP_SYS_ADMIN", "CAP_SYS_MODULE"})
WITHHELD_KERNEL_RULES = frozenset({(4, 8)})

ARCHITECTURES = {
    "x86_64": ("SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"),
    "aarch64": ("SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"),
}


def _machine(machine: str | None) -> str:
    arch = (machine or platform.machine()).lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def _allow(names: Iterable[str], *args: Mapping[str, int | str]) -> dict[str, Any]:
    rule: dict[str, Any] = {"names": list(names), "action": "SCMP_ACT_ALLOW"}
    if args:
        rule["args"] = [dict(a) for a in args]
    return rule


def _arg0(op: str, value: int, value_two: int | None = None) -> dict[str, int | str]:
    arg: dict[str, int | str] = {"index": 0, "value": value, "op": op}
    if value_two is not None:
        arg["valueTwo"] = value_two
    return arg


def default_profile(
    capabilities: Sequence[str] = (),
    machine: str | None = None,
    kernel: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object for an unprivileged sandbox whose bounding
    set is ``capabilities``, on ``machine`` (default: this one) with kernel
    ``kernel`` ((major, minor); None: older than every kernel rule)."""
    arch = _machine(machine)
    granted = set(capabilities) - WITHHELD_CAPABILITIES
    rules = [
        _allow(ALLOWED),
        _allow(["socket"], _arg0("SCMP_CMP_LT", AF_ALG)),
        _allow(["socket"], _arg0("SCMP_CMP_EQ", AF_ALG + 1)),
        _allow(["socket"], _arg0("SCMP_CMP_GT", AF_VSOCK)),
        *(_allow(["personality"], _arg0("SCMP_CMP_EQ", p)) for p in PERSONALITIES),
    ]
    rules += [
        _allow(names)
        for since, names in BY_KERNEL.items()
        if kernel is not None and kernel >= since and since not in WITHHELD_KERNEL_RULES
    ]
    if BY_ARCH.get(arch):
        rules.append(_allow(BY_ARCH[arch]))
    rules += [_allow(BY_CAPABILITY[c]) for c in BY_CAPABILITY if c in granted]
    if "CAP_SYS_ADMIN" not in granted:
        rules.append(_allow(["clone"], _arg0("SCMP_CMP_MASKED_EQ", NAMESPACE_MASK, 0)))
        rules.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    return {
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": EPERM,
        "architectures": list(ARCHITECTURES.get(arch, ())),
        "syscalls": rules,
    }


def allowed_syscalls(profile: Mapping[str, Any]) -> set[str]:
    """The syscalls a profile allows whatever their arguments."""
    return {
        name
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW" and not rule.get("args")
        for name in rule["names"]
    }


def kernel_version(release: str) -> tuple[int, int] | None:
    """(major, minor) of a ``uname -r`` string such as ``6.8.0-45-generic``."""
    parts = release.split(".", 2)
    try:
        return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or "x")
    except (IndexError, ValueError):
        return None
