"""``hostUsers: false`` on real containerd and runc: the sandbox's root is an
unprivileged user of the node, and the image's files are root's inside."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandlot.adapters.cni import join_netns
from sandlot.adapters.cni.netns import Netns
from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import ContainerSpec, TaskState
from sandlot.agent.teardown import teardown_many
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.ocispec import ImageConfig, build_oci_spec
from sandlot.policy.userns import IdRange, with_user_namespace
from tests.support.containerd_fixtures import ImageFactory
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd]

IMAGE = "docker.io/sandlot/userns:test"


@pytest.fixture(scope="module")
def image(image_factory: ImageFactory) -> str:
    return image_factory(IMAGE, extra_files={"/etc/motd": b"hello\n"})


@pytest.fixture
def started(runtime: ContainerdRuntime) -> Iterator[list[str]]:
    ids: list[str] = []
    yield ids
    teardown_many(runtime, ids, kill_wait=3, call_timeout=5, concurrency=4)


def _run(
    runtime: ContainerdRuntime,
    image: str,
    ids: IdRange,
    script: str,
    log: Path,
    started: list[str],
    netns: str | None = None,
) -> int:
    container_id = f"userns-{uuid.uuid4().hex[:10]}"
    started.append(container_id)
    spec = SandboxSpec.model_validate(
        {"image": image, "command": ["sh", "-c", script], "hostUsers": False}
    )
    config: ImageConfig = runtime.image_config(image, timeout=10)
    oci = build_oci_spec(container_id, spec, config, hostname="u")
    if netns is not None:
        join_netns(oci, netns)
    oci = with_user_namespace(oci, ids)
    runtime.create_container(ContainerSpec(id=container_id, image=image, oci_spec=oci), timeout=30)
    return runtime.start_task(container_id, stdio=f"file://{log}", timeout=10).pid


def test_root_inside_is_the_ranges_first_id_on_the_host(
    runtime: ContainerdRuntime, image: str, tmp_path: Path, started: list[str]
) -> None:
    ids = IdRange(1 << 24)
    log = tmp_path / "out.log"
    script = (
        "cat /proc/self/uid_map /proc/self/gid_map; id -u; id -g; "
        "stat -c '%n %u %g' / /bin/busybox /etc/motd /tmp; "
        "touch /made-here && stat -c '%n %u' /made-here; echo done; sleep 30"
    )
    pid = _run(runtime, image, ids, script, log, started)
    text = wait_for(
        lambda: log.exists() and "done" in log.read_text() and log.read_text(),
        timeout=20,
        what="the sandbox's report",
    )
    lines = [line.split() for line in text.splitlines()]
    assert lines[0] == ["0", str(ids.first), str(ids.size)], text  # uid_map
    assert lines[1] == ["0", str(ids.first), str(ids.size)], text  # gid_map
    assert lines[2:4] == [["0"], ["0"]], text
    owners = {line[0]: line[1:] for line in lines[4:9]}
    for path in ("/", "/bin/busybox", "/etc/motd", "/tmp"):
        assert owners[path] == ["0", "0"], f"{path} inside: {owners}"
    assert owners["/made-here"] == ["0"], owners
    # The node sees the range: the process's UID and the image's files are its first ID.
    status = Path(f"/proc/{pid}/status").read_text()
    uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
    assert uid_line.split()[1:] == [str(ids.first)] * 4, uid_line
    for path in ("bin/busybox", "etc/motd", "made-here"):
        st = os.stat(f"/proc/{pid}/root/{path}")
        assert (st.st_uid, st.st_gid) == (ids.first, ids.first), path
    task = runtime.get_task(started[0], timeout=5)
    assert task is not None and task.state is TaskState.RUNNING


def test_two_ranges_never_share_an_owner(
    runtime: ContainerdRuntime, image: str, tmp_path: Path, started: list[str]
) -> None:
    first, second = IdRange(1 << 24), IdRange((1 << 24) + 65536)
    pids = [
        _run(runtime, image, ids, "sleep 30", tmp_path / f"{i}.log", started)
        for i, ids in enumerate((first, second))
    ]
    owners = [os.stat(f"/proc/{pid}/root/etc/motd").st_uid for pid in pids]
    assert owners == [first.first, second.first], owners


def test_teardown_removes_the_sandboxs_own_root_filesystem(
    runtime: ContainerdRuntime, image: str, tmp_path: Path
) -> None:
    started: list[str] = []
    _run(runtime, image, IdRange(1 << 24), "sleep 30", tmp_path / "out.log", started)
    assert started[0] in runtime.list_snapshots(timeout=5)
    result = teardown_many(runtime, started, kill_wait=3, call_timeout=5, concurrency=1)
    assert started[0] not in runtime.list_snapshots(timeout=5), result
    assert started[0] not in {c.id for c in runtime.list_containers(timeout=5)}


def test_a_network_namespace_made_outside_is_joined_with_the_nodes_sys_read_only(
    runtime: ContainerdRuntime, image: str, tmp_path: Path, started: list[str]
) -> None:
    """As a CNI-attached sandbox: its network namespace belongs to the node's user
    namespace, where the sandbox may not mount a sysfs."""
    netns = Netns(timeout=10)
    name = f"sl-userns-{uuid.uuid4().hex[:8]}"
    path = netns.create(name)
    try:
        log = tmp_path / "out.log"
        script = "cat /proc/self/uid_map; touch /sys/x 2>&1 || echo read-only; echo done; sleep 30"
        pid = _run(runtime, image, IdRange(1 << 24), script, log, started, netns=path)
        text = wait_for(
            lambda: log.exists() and "done" in log.read_text() and log.read_text(),
            timeout=20,
            what="the sandbox's report",
        )
        assert text.split()[:3] == ["0", str(1 << 24), "65536"], text
        assert "read-only" in text, text
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(path).st_ino
    finally:
        teardown_many(runtime, list(started), kill_wait=3, call_timeout=5, concurrency=4)
        started.clear()
        netns.delete(name)
