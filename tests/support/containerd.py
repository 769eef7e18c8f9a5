"""A private containerd for tests and the shim faults they inject: the package's
own ``sandlot.devtools.containerd`` (the demo uses it too)."""

from sandlot.devtools.containerd import (
    NAMESPACE,
    REQUIRED_BINARIES,
    SHIM_BINARY,
    PrivateContainerd,
    all_threads_stopped,
    find_shim_pid,
    scratch_cgroup,
    scratch_spec,
    shim_pids,
    start_private_containerd,
    stopped_process,
    unavailable_reason,
)

__all__ = [
    "NAMESPACE",
    "REQUIRED_BINARIES",
    "SHIM_BINARY",
    "PrivateContainerd",
    "all_threads_stopped",
    "find_shim_pid",
    "scratch_cgroup",
    "scratch_spec",
    "shim_pids",
    "start_private_containerd",
    "stopped_process",
    "unavailable_reason",
]
