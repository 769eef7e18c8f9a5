"""Runtime classes, pure: the handlers a containerd configuration offers, what a
RuntimeClass means (or why it is refused), the handler check, the joined placement,
the scheduler's choice by handler, the overhead in capacity, and the agent's reads
of RuntimeClasses kept for a TTL on a fake clock."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sandlot.agent.runtimes import ContainerdConfigUnreadable, RuntimeClasses, discover
from sandlot.api.node import NodePhase
from sandlot.api.placement import Toleration
from sandlot.api.reasons import SandboxReason
from sandlot.policy.capacity import Capacity
from sandlot.policy.ocispec import FILES_TOOL
from sandlot.policy.placement import Placement
from sandlot.policy.runtimeclass import (
    RUNC_RUNTIME_TYPE,
    Discovery,
    RuntimeClassInfo,
    RuntimeClassRefused,
    RuntimeHandler,
    as_pod_sandbox,
    check_handler,
    discover_handlers,
    host_view,
    joined_placement,
    read_runtime_class,
    shim_binary,
    with_files_tool,
)
from sandlot.policy.scheduling import NodeSlot, SandboxRequest, Unschedulable, choose_node
from sandlot.policy.startrefusals import Refusal, StartFacts, refused_starts

V2 = "io.containerd.grpc.v1.cri"
V3 = "io.containerd.cri.v1.runtime"
INSTALLED = {"/usr/bin/crun", "containerd-shim-runsc-v1"}
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def config(plugin: str, **runtimes: Mapping[str, Any]) -> dict[str, Any]:
    return {"plugins": {plugin: {"containerd": {"runtimes": runtimes}}}}


CRUN = {"runtime_type": RUNC_RUNTIME_TYPE, "options": {"BinaryName": "/usr/bin/crun"}}


@pytest.mark.parametrize(
    ("cfg", "names", "skipped"),
    [
        ({}, ["runc"], []),
        (config(V2, crun=CRUN), ["runc", "crun"], []),
        (config(V3, crun=CRUN), ["runc", "crun"], []),
        (config(V2, runc={"runtime_type": RUNC_RUNTIME_TYPE}, crun=CRUN), ["crun", "runc"], []),
        (
            config(V2, crun={"options": {"BinaryName": "/opt/crun"}}),
            ["runc"],
            ["crun"],
        ),
        (config(V3, gvisor={"runtime_type": "io.containerd.runsc.v1"}), ["runc", "gvisor"], []),
        (config(V3, kata={"runtime_type": "io.containerd.kata.v2"}), ["runc"], ["kata"]),
        (config(V2, Bad_Name=CRUN), ["runc"], ["Bad_Name"]),
        (
            config(V3, gvisor={"runtime_type": "io.containerd.runsc.v1", "runtime_path": "/opt/s"}),
            ["runc"],
            ["gvisor"],
        ),
    ],
    ids=[
        "no-config-runc-only",
        "crun-v2",
        "crun-v3",
        "runc-declared",
        "missing-binary-skipped",
        "shim-installed",
        "shim-missing-skipped",
        "bad-name-skipped",
        "runtime-path-missing-skipped",
    ],
)
def test_discovery_offers_what_exists_and_runc_always(
    cfg: dict[str, Any], names: list[str], skipped: list[str]
) -> None:
    found = discover_handlers(cfg, INSTALLED.__contains__)
    assert list(found.names) == names
    assert [name for name, _ in found.skipped] == skipped


RUNSC = {"runtime_type": "io.containerd.runsc.v1", "runtime_path": "/opt/shim-runsc"}


@pytest.mark.parametrize(
    ("version", "offered"),
    [("1.6.20~ds1", False), ("v1.7.2", False), ("2.4.2", True), ("v2.0.0", True), ("", True)],
    ids=["debian-1.6", "1.7", "2.4", "v2.0", "unknown"],
)
def test_gvisors_shim_is_offered_only_on_containerd_2(version: str, offered: bool) -> None:
    found = discover_handlers(
        config(V3, gvisor=RUNSC, crun=CRUN),
        {"/opt/shim-runsc", "/usr/bin/crun"}.__contains__,
        version,
    )
    assert ("gvisor" in found.names) is offered
    assert "crun" in found.names  # the runc shim runs on either
    if not offered:
        assert dict(found.skipped)["gvisor"] == (
            f"its shim /opt/shim-runsc needs containerd 2.x; this node runs {version}"
        )


def test_a_crun_handler_carries_its_binary_and_the_runc_shim() -> None:
    found = discover_handlers(config(V2, crun=CRUN), INSTALLED.__contains__)
    assert found.get("crun") == RuntimeHandler("crun", RUNC_RUNTIME_TYPE, "/usr/bin/crun")
    assert shim_binary("io.containerd.runsc.v1") == "containerd-shim-runsc-v1"


def test_a_shim_named_by_path_is_what_containerd_runs() -> None:
    runsc = {"runtime_type": "io.containerd.runsc.v1", "runtime_path": "/opt/shim-runsc"}
    found = discover_handlers(config(V3, gvisor=runsc), {"/opt/shim-runsc"}.__contains__)
    handler = found.get("gvisor")
    assert handler is not None and handler.shim == "/opt/shim-runsc"
    assert RuntimeHandler("crun", binary_name="/usr/bin/crun").shim == RUNC_RUNTIME_TYPE


def test_only_a_shim_of_its_own_kind_gets_the_pod_sandbox_annotation() -> None:
    spec = {"process": {}, "annotations": {"a": "b"}}
    assert as_pod_sandbox(spec, None) is spec
    assert as_pod_sandbox(spec, RuntimeHandler("crun", binary_name="/usr/bin/crun")) is spec
    marked = as_pod_sandbox(spec, RuntimeHandler("gvisor", "io.containerd.runsc.v1"))
    assert marked["annotations"] == {"a": "b", "io.kubernetes.cri.container-type": "sandbox"}
    assert spec["annotations"] == {"a": "b"}


@pytest.mark.parametrize(
    ("source", "handler", "mounted"),
    [
        ("/var/lib/sandlot/bin/sandlot-files", None, True),
        ("/var/lib/sandlot/bin/sandlot-files", RuntimeHandler("crun", binary_name="/x/crun"), True),
        (
            "/var/lib/sandlot/bin/sandlot-files",
            RuntimeHandler("gvisor", "io.containerd.runsc.v1"),
            False,
        ),
        (None, None, False),
    ],
    ids=["runc", "crun-through-the-runc-shim", "gvisor-keeps-the-images-tools", "node-without-it"],
)
def test_the_files_tool_is_mounted_read_only_under_dev_for_a_handler_with_a_host_view(
    source: str | None, handler: RuntimeHandler | None, mounted: bool
) -> None:
    spec: dict[str, Any] = {"mounts": [{"destination": "/dev", "type": "tmpfs"}]}
    out = with_files_tool(spec, source, handler)
    tools = [m for m in out["mounts"] if m["destination"] == FILES_TOOL]
    if not mounted:
        assert out["mounts"] == spec["mounts"]
        return
    assert tools == [
        {
            "destination": "/dev/.sandlot/files",
            "type": "bind",
            "source": source,
            "options": ["bind", "ro", "nosuid", "nodev"],
        }
    ]
    # After /dev's tmpfs: the file is made there, never in the root filesystem.
    assert out["mounts"].index(tools[0]) > 0 and len(spec["mounts"]) == 1


@pytest.mark.parametrize(
    ("runtime_name", "seen_from_host"),
    [
        ("", True),  # containerd's default runtime: runc
        (RUNC_RUNTIME_TYPE, True),  # runc, and crun through the runc shim's BinaryName
        ("/opt/sandlot/bin/containerd-shim-runc-v2", True),
        ("io.containerd.runsc.v1", False),  # gVisor: the sentry serves files and loopback
        ("/opt/gvisor/containerd-shim-runsc-v1", False),
        ("io.containerd.kata.v2", False),
    ],
)
def test_only_the_runc_shim_gives_the_node_a_view_of_the_container(
    runtime_name: str, seen_from_host: bool
) -> None:
    assert host_view(runtime_name) is seen_from_host


@pytest.mark.parametrize(
    ("body", "reason", "names"),
    [
        (None, SandboxReason.RUNTIME_CLASS_NOT_FOUND, "does not exist"),
        ({"handler": "Not_A_Label"}, SandboxReason.INVALID_RUNTIME_CLASS, "Not_A_Label"),
        (
            {"handler": "crun", "overhead": {"podFixed": {"example.com/gpu": "1"}}},
            SandboxReason.INVALID_RUNTIME_CLASS,
            "example.com/gpu",
        ),
        (
            {"handler": "crun", "overhead": {"podFixed": {"memory": "lots"}}},
            SandboxReason.INVALID_RUNTIME_CLASS,
            "overhead.podFixed",
        ),
        (
            {"handler": "crun", "scheduling": {"tolerations": [{"effect": "Sometimes"}]}},
            SandboxReason.INVALID_RUNTIME_CLASS,
            "scheduling.tolerations",
        ),
    ],
    ids=["missing", "bad-handler", "uncounted-overhead", "bad-quantity", "bad-toleration"],
)
def test_a_class_that_cannot_be_honoured_is_refused(
    body: dict[str, Any] | None, reason: str, names: str
) -> None:
    with pytest.raises(RuntimeClassRefused) as refused:
        read_runtime_class("rc", body)
    assert refused.value.reason == reason
    assert names in str(refused.value) and '"rc"' in str(refused.value)


def test_a_class_gives_its_handler_scheduling_and_overhead() -> None:
    body = {
        "handler": "crun",
        "scheduling": {
            "nodeSelector": {"runtime": "crun"},
            "tolerations": [{"key": "sandbox", "operator": "Exists"}],
        },
        "overhead": {"podFixed": {"memory": "64Mi", "cpu": "250m"}},
    }
    info = read_runtime_class("fast", body)
    assert info == RuntimeClassInfo(
        "fast",
        "crun",
        (("runtime", "crun"),),
        (Toleration(key="sandbox", operator="Exists"),),
        64 * 2**20,
        250,
    )


def test_a_handler_the_node_lacks_is_refused_naming_both() -> None:
    info = RuntimeClassInfo("secure", "gvisor")
    check_handler(info, "n1", ["runc", "gvisor"])
    with pytest.raises(RuntimeClassRefused) as refused:
        check_handler(info, "n1", ["runc", "crun"])
    assert refused.value.reason == SandboxReason.RUNTIME_HANDLER_UNKNOWN
    assert '"gvisor"' in str(refused.value) and "crun, runc" in str(refused.value)


@pytest.mark.parametrize(
    ("own", "selector", "expected"),
    [
        (None, (), None),
        (None, (("runtime", "crun"),), None),
        (
            Placement(node_selector=(("zone", "a"),)),
            (("runtime", "crun"),),
            (("zone", "a"),),
        ),
    ],
    ids=["nothing", "class-only", "both"],
)
def test_the_class_selector_is_not_joined_into_the_sandbox_s(
    own: Placement | None,
    selector: tuple[tuple[str, str], ...],
    expected: tuple[tuple[str, str], ...] | None,
) -> None:
    """A RuntimeClass's selector names the Kubernetes Nodes' labels, which SandboxNodes
    do not carry: it is matched where the node is chosen (policy.nodetrust), not
    joined into the selector matched against a SandboxNode's labels."""
    joined = joined_placement(own, RuntimeClassInfo("rc", "crun", selector))
    assert (joined.node_selector if joined else None) == expected


def _slot(name: str, *handlers: str, load: int = 0) -> NodeSlot:
    return NodeSlot(
        name=name,
        phase=NodePhase.READY,
        unschedulable=False,
        capacity=10,
        sandboxes=load,
        runtime_handlers=frozenset(handlers),
    )


@pytest.mark.parametrize(
    ("handler", "expected"),
    [(None, "plain"), ("crun", "crun-node"), ("runc", "plain")],
    ids=["no-class-least-loaded", "crun-only-where-offered", "runc-anywhere"],
)
def test_the_scheduler_places_only_on_nodes_with_the_handler(
    handler: str | None, expected: str
) -> None:
    nodes = [_slot("plain", "runc"), _slot("crun-node", "runc", "crun", load=5)]
    assert choose_node(SandboxRequest("ns/a", handler=handler), nodes, NOW).node == expected


def test_no_node_with_the_handler_says_so() -> None:
    choice = choose_node(SandboxRequest("ns/a", handler="gvisor"), [_slot("a", "runc")], NOW)
    assert choice.reason is Unschedulable.NO_MATCHING_NODE
    assert choice.message == '0/1 nodes are available: 1 no runtime handler "gvisor"'


def test_the_overhead_counts_in_capacity_beside_the_limits() -> None:
    body = {
        "metadata": {"namespace": "ns", "name": "heavy", "uid": "u1"},
        "spec": {"image": "i", "nodeName": "n", "resources": {"limits": {"memory": "600Mi"}}},
        "status": {"phase": "Scheduled"},
    }
    facts = StartFacts("n", Capacity(sandboxes=10, memory=2**30), {"ns/heavy": body})
    assert refused_starts(["ns/heavy"], [], facts) == {}
    heavy_class = {"ns/heavy": RuntimeClassInfo("vm", "crun", overhead_memory=600 * 2**20)}
    refused = refused_starts(["ns/heavy"], [], replace(facts, classes=heavy_class))
    assert refused["ns/heavy"].how is Refusal.FAIL
    assert "1.17Gi does not fit" in refused["ns/heavy"].message


def test_the_agent_reads_a_class_once_per_ttl() -> None:
    reads: list[str] = []
    now = [0.0]

    def read(name: str) -> dict[str, Any] | None:
        reads.append(name)
        return {"handler": "crun"}

    classes = RuntimeClasses(
        read,
        "n1",
        Discovery((RuntimeHandler("runc"), RuntimeHandler("crun"))),
        clock=lambda: now[0],
    )
    spec = {"runtimeClassName": "fast"}
    assert classes.resolve(spec)[1] == RuntimeHandler("crun")
    now[0] = 4.9
    classes.resolve(spec)
    assert reads == ["fast"]
    now[0] = 5.0
    classes.resolve(spec)
    assert reads == ["fast", "fast"]
    assert classes.resolve({}) == (None, None)


def test_a_containerd_config_that_is_not_toml_stops_the_agent_naming_the_setting(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.toml"
    config.write_text("version = [")
    with pytest.raises(ContainerdConfigUnreadable, match="--containerd-config / SANDLOT_"):
        discover(str(config))
    assert discover(str(tmp_path / "absent.toml")).names == ("runc",)
