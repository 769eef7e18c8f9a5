"""The OCI spec a sandbox gets: safe defaults, and the security context honoured.

Pure: the dict ``build_oci_spec`` returns. What runc and the kernel do with it is
claimed in tests/integration/test_isolation_sandbox.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sandlot.adapters.nodeguard import bounding_capabilities, oom_kills, swap_accounted
from sandlot.api.admission import BASELINE_ADDABLE, CHART_TEMPLATE, chart_template
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.limits import LimitRefused
from sandlot.policy.ocispec import (
    ALL_CAPABILITIES,
    DEFAULT_CAPABILITIES,
    MASKED_PATHS,
    READONLY_PATHS,
    ImageConfig,
    RunAsRootRefused,
    build_oci_spec,
    capability_mask,
)
from sandlot.policy.seccomp import (
    ALLOWED,
    BY_CAPABILITY,
    NAMESPACE_MASK,
    allowed_syscalls,
    default_profile,
    kernel_version,
)

ROOT = Path(__file__).resolve().parents[2]


def build(config: ImageConfig | None = None, **fields: Any) -> dict[str, Any]:
    spec = SandboxSpec.model_validate({"image": "img", "command": ["sh"], **fields})
    return build_oci_spec("sb-1", spec, config or ImageConfig(), hostname="box")


def test_default_sandbox_gets_own_namespaces_baseline_caps_and_no_new_privileges() -> None:
    oci = build()
    assert [n["type"] for n in oci["linux"]["namespaces"]] == [
        "pid",
        "ipc",
        "uts",
        "mount",
        "network",
    ]
    caps = oci["process"]["capabilities"]
    assert caps == {k: list(DEFAULT_CAPABILITIES) for k in ("bounding", "effective", "permitted")}
    assert oci["process"]["noNewPrivileges"] is True
    assert oci["linux"]["seccomp"]["defaultAction"] == "SCMP_ACT_ERRNO"
    assert oci["linux"]["maskedPaths"] == list(MASKED_PATHS)
    assert oci["linux"]["readonlyPaths"] == list(READONLY_PATHS)
    assert oci["linux"]["resources"]["pids"] == {"limit": 1024}
    assert oci["root"]["readonly"] is False
    assert oci["linux"]["cgroupsPath"] == "/sandlot/sb-1"


def test_no_host_paths_are_mounted() -> None:
    kinds = {m["type"] for m in build(hostNetwork=True)["mounts"]}
    assert kinds <= {"proc", "tmpfs", "devpts", "mqueue", "sysfs"}, "a bind mount of a host path"


def test_baseline_drops_the_risky_defaults_and_stays_inside_what_baseline_may_add() -> None:
    for risky in ("CAP_NET_RAW", "CAP_MKNOD", "CAP_SETFCAP", "CAP_SYS_ADMIN", "CAP_SYS_MODULE"):
        assert risky not in DEFAULT_CAPABILITIES
    assert {c.removeprefix("CAP_") for c in DEFAULT_CAPABILITIES} <= set(BASELINE_ADDABLE)


def test_host_network_leaves_out_the_network_namespace_only() -> None:
    kinds = [n["type"] for n in build(hostNetwork=True)["linux"]["namespaces"]]
    assert kinds == ["pid", "ipc", "uts", "mount"]


def test_added_capabilities_join_the_baseline_in_either_spelling() -> None:
    oci = build(securityContext={"capabilities": {"add": ["net_admin", "CAP_NET_RAW", "CHOWN"]}})
    caps = oci["process"]["capabilities"]["effective"]
    assert caps == [*DEFAULT_CAPABILITIES, "CAP_NET_ADMIN", "CAP_NET_RAW"]


def test_privileged_gets_the_node_capabilities_and_loses_seccomp_and_masks() -> None:
    spec = SandboxSpec.model_validate(
        {"image": "img", "command": ["sh"], "securityContext": {"privileged": True}}
    )
    node = ALL_CAPABILITIES[:30]
    oci = build_oci_spec("sb-1", spec, ImageConfig(), hostname="b", node_capabilities=node)
    assert oci["process"]["capabilities"]["bounding"] == list(node)
    assert "seccomp" not in oci["linux"]
    assert "maskedPaths" not in oci["linux"] and "readonlyPaths" not in oci["linux"]
    assert oci["process"]["noNewPrivileges"] is True


@pytest.mark.parametrize(
    ("context", "config", "user"),
    [
        ({}, ImageConfig(), {"uid": 0, "gid": 0}),
        ({}, ImageConfig(user="1000:2000"), {"uid": 1000, "gid": 2000}),
        ({"runAsUser": 5, "runAsGroup": 6}, ImageConfig(user="1000"), {"uid": 5, "gid": 6}),
        ({"runAsNonRoot": True}, ImageConfig(user="1000"), {"uid": 1000, "gid": 0}),
    ],
    ids=["root by default", "image user", "runAsUser wins", "runAsNonRoot with a non-root image"],
)
def test_process_user(context: dict[str, Any], config: ImageConfig, user: dict[str, int]) -> None:
    assert build(config, securityContext=context)["process"]["user"] == user


@pytest.mark.parametrize(
    ("context", "config", "source"),
    [
        ({"runAsNonRoot": True}, ImageConfig(), "the image"),
        ({"runAsNonRoot": True, "runAsUser": 0}, ImageConfig(user="1000"), "runAsUser"),
    ],
    ids=["root image", "explicit uid 0"],
)
def test_run_as_non_root_refuses_uid_0_naming_where_it_came_from(
    context: dict[str, Any], config: ImageConfig, source: str
) -> None:
    with pytest.raises(RunAsRootRefused, match=f"UID 0 \\(from .*{source}"):
        build(config, securityContext=context)


def test_read_only_root_filesystem() -> None:
    assert build(securityContext={"readOnlyRootFilesystem": True})["root"]["readonly"] is True


@pytest.mark.parametrize(
    ("limits", "limit_swap", "resources"),
    [
        ({"memory": "64Mi"}, False, {"memory": {"limit": 64 * 2**20}}),
        ({"memory": "1G"}, True, {"memory": {"limit": 10**9, "swap": 10**9}}),
        ({"cpu": "250m"}, False, {"cpu": {"quota": 25_000, "period": 100_000}}),
        ({"cpu": "1.5"}, False, {"cpu": {"quota": 150_000, "period": 100_000}}),
    ],
    ids=["memory", "memory with no swap beyond it", "millicores", "cores"],
)
def test_resource_limits(
    limits: dict[str, str], limit_swap: bool, resources: dict[str, Any]
) -> None:
    spec = SandboxSpec.model_validate(
        {"image": "img", "command": ["sh"], "resources": {"limits": limits}}
    )
    oci = build_oci_spec("sb", spec, ImageConfig(), hostname="b", limit_swap=limit_swap)
    for key, value in resources.items():
        assert oci["linux"]["resources"][key] == value


@pytest.mark.parametrize(
    ("limits", "pids", "named"),
    [
        ({"memory": "0"}, 1024, "spec.resources.limits.memory '0'"),
        ({"memory": "0Mi"}, 1024, "spec.resources.limits.memory '0Mi'"),
        ({"memory": "1"}, 1024, "spec.resources.limits.memory '1'"),
        ({"cpu": "0"}, 1024, "spec.resources.limits.cpu '0'"),
        ({}, 0, "the pids limit 0"),
    ],
    ids=["memory 0", "memory 0Mi", "memory 1 byte", "cpu 0", "pids 0"],
)
def test_a_limit_that_would_mean_none_is_refused(
    limits: dict[str, str], pids: int, named: str
) -> None:
    spec = SandboxSpec.model_validate(
        {"image": "img", "command": ["sh"], "resources": {"limits": limits}}
    )
    with pytest.raises(LimitRefused, match=re.escape(named)):
        build_oci_spec("sb", spec, ImageConfig(), hostname="b", pids_limit=pids)


# ------------------------------------------------------------------ seccomp data
# The profile's effect is claimed against runc and the kernel in
# tests/integration/test_isolation_defaults.py; these pin the data.

BASELINE_PROFILE = default_profile(DEFAULT_CAPABILITIES, "x86_64", (6, 8))


@pytest.mark.parametrize(
    "syscall",
    [
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "fsopen",
        "fsmount",
        "open_tree",
        "keyctl",
        "add_key",
        "request_key",
        "ptrace",
        "bpf",
        "perf_event_open",
        "unshare",
        "setns",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "settimeofday",
        "clock_settime",
        "open_by_handle_at",
        "io_uring_setup",
        "personality",
        "socket",
        "mbind",
        "userfaultfd",
    ],
)
def test_seccomp_refuses_with_eperm(syscall: str) -> None:
    # An allow-list: refused means allowed by no rule without arguments, and the
    # default action answers EPERM.
    assert BASELINE_PROFILE["defaultAction"] == "SCMP_ACT_ERRNO"
    assert BASELINE_PROFILE["defaultErrnoRet"] == 1
    assert syscall not in allowed_syscalls(BASELINE_PROFILE)


def test_seccomp_refuses_clone_with_any_namespace_flag_and_clone3_with_enosys() -> None:
    rules = BASELINE_PROFILE["syscalls"]
    (clone,) = [r for r in rules if r["names"] == ["clone"]]
    assert clone["action"] == "SCMP_ACT_ALLOW"
    (arg,) = clone["args"]
    assert arg == {"index": 0, "op": "SCMP_CMP_MASKED_EQ", "value": NAMESPACE_MASK, "valueTwo": 0}
    assert (
        sum([0x20000, 0x2000000, 0x4000000, 0x8000000, 0x10000000, 0x20000000, 0x40000000])
        == NAMESPACE_MASK
    )
    (clone3,) = [r for r in rules if r["names"] == ["clone3"]]
    assert clone3["action"] == "SCMP_ACT_ERRNO" and clone3["errnoRet"] == 38


@pytest.mark.parametrize(
    ("machine", "arches"),
    [
        ("x86_64", ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]),
        ("arm64", ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]),
    ],
    ids=["amd64 with its compat ABIs", "arm64 with arm"],
)
def test_seccomp_covers_compat_architectures(machine: str, arches: list[str]) -> None:
    assert default_profile((), machine)["architectures"] == arches


def test_allow_list_has_no_duplicates_and_allows_ordinary_calls() -> None:
    assert len(ALLOWED) == len(set(ALLOWED))
    allowed = allowed_syscalls(BASELINE_PROFILE)
    for ordinary in ("read", "write", "execve", "openat", "chroot", "arch_prctl", "wait4"):
        assert ordinary in allowed


@pytest.mark.parametrize(
    ("value", "allowed"),
    [(0x0, True), (0x8, True), (0xFFFFFFFF, True), (0x0040000, False), (0x0400000, False)],
    ids=["PER_LINUX", "PER_LINUX32", "query", "ADDR_NO_RANDOMIZE", "READ_IMPLIES_EXEC"],
)
def test_personality_only_with_the_values_containerd_allows(value: int, allowed: bool) -> None:
    values = {
        r["args"][0]["value"] for r in BASELINE_PROFILE["syscalls"] if r["names"] == ["personality"]
    }
    assert (value in values) is allowed


def test_socket_allowed_for_every_family_but_alg_and_vsock() -> None:
    rules = [r for r in BASELINE_PROFILE["syscalls"] if r["names"] == ["socket"]]

    def passes(family: int) -> bool:
        ops = {"SCMP_CMP_LT": family.__lt__, "SCMP_CMP_EQ": family.__eq__}
        ops["SCMP_CMP_GT"] = family.__gt__
        return any(ops[r["args"][0]["op"]](r["args"][0]["value"]) for r in rules)

    assert [f for f in range(0, 46) if not passes(f)] == [38, 40]


@pytest.mark.parametrize(
    ("capability", "opens", "withheld"),
    [
        ("CAP_SYS_TIME", {"settimeofday", "clock_settime"}, False),
        ("CAP_SYS_PTRACE", {"ptrace", "process_vm_readv", "kcmp"}, False),
        ("CAP_SYS_NICE", {"mbind", "set_mempolicy"}, False),
        ("CAP_DAC_READ_SEARCH", {"open_by_handle_at"}, False),
        ("CAP_SYS_ADMIN", {"mount", "unshare", "setns", "bpf"}, True),
        ("CAP_SYS_MODULE", {"init_module", "finit_module"}, True),
    ],
    ids=["sys_time", "sys_ptrace", "sys_nice", "dac_read_search", "sys_admin", "sys_module"],
)
def test_capability_opens_its_syscalls_as_containerd_does_except_the_withheld(
    capability: str, opens: set[str], withheld: bool
) -> None:
    assert opens <= set(BY_CAPABILITY[capability])  # transcribed from containerd
    profile = default_profile([*DEFAULT_CAPABILITIES, capability], "x86_64", (6, 8))
    assert (opens <= allowed_syscalls(profile)) is not withheld
    assert not opens & allowed_syscalls(BASELINE_PROFILE)


def test_sys_admin_withheld_keeps_the_clone_flag_rule() -> None:
    profile = default_profile([*DEFAULT_CAPABILITIES, "CAP_SYS_ADMIN"], "x86_64")
    assert any(r["names"] == ["clone"] and r.get("args") for r in profile["syscalls"])
    assert "clone" not in allowed_syscalls(profile)


@pytest.mark.parametrize(
    ("release", "version"),
    [("6.8.0-45-generic", (6, 8)), ("4.19.0", (4, 19)), ("5.10+", (5, 10)), ("weird", None)],
    ids=["ubuntu", "plain", "plus suffix", "unparsable"],
)
def test_kernel_version(release: str, version: tuple[int, int] | None) -> None:
    assert kernel_version(release) == version


def test_masked_and_read_only_paths_are_containerds() -> None:
    # containerd's pkg/oci populateDefaultUnixSpec, in its order.
    assert MASKED_PATHS == (
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
    assert READONLY_PATHS == (
        "/proc/bus",
        "/proc/fs",
        "/proc/irq",
        "/proc/sys",
        "/proc/sysrq-trigger",
    )


# ------------------------------------------------------------------ node reads (files)


def test_capability_mask_matches_the_kernel_bits() -> None:
    assert capability_mask(["CAP_CHOWN", "CAP_KILL"]) == 0b100001
    assert capability_mask(ALL_CAPABILITIES) == (1 << 41) - 1


def test_bounding_capabilities_from_proc_status(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapBnd:\t000001fffeffffff\n")
    caps = bounding_capabilities(ALL_CAPABILITIES, status)
    assert "CAP_SYS_RESOURCE" not in caps and len(caps) == 40


@pytest.mark.parametrize("v2", [False, True], ids=["cgroup v1", "cgroup v2"])
def test_oom_kills_read_from_the_container_cgroup(tmp_path: Path, v2: bool) -> None:
    if v2:
        (tmp_path / "cgroup.controllers").write_text("memory pids\n")
        target = tmp_path / "sandlot" / "sb-1" / "memory.events"
        text = "low 0\nhigh 0\nmax 4\noom 1\noom_kill 1\n"
    else:
        target = tmp_path / "memory" / "sandlot" / "sb-1" / "memory.oom_control"
        text = "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
    assert oom_kills(tmp_path, "/sandlot/sb-1") is None  # no cgroup: unknown, not zero
    target.parent.mkdir(parents=True)
    target.write_text(text)
    assert oom_kills(tmp_path, "/sandlot/sb-1") == 1


def test_swap_limit_only_where_the_kernel_accounts_swap(tmp_path: Path) -> None:
    (tmp_path / "memory").mkdir()
    assert swap_accounted(tmp_path) is False
    (tmp_path / "memory" / "memory.memsw.limit_in_bytes").write_text("0")
    assert swap_accounted(tmp_path) is True


# ------------------------------------------------------------------ the chart's copy


def test_committed_admission_template_matches_the_policy() -> None:
    committed = (ROOT / CHART_TEMPLATE).read_text()
    assert committed == chart_template(), (
        f"{CHART_TEMPLATE} is out of date; regenerate with `sandlot gen admission` and commit it"
    )
