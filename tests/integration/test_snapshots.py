"""SandboxSnapshots and forks, with a real operator, a real agent and containerd.

A sandbox prepares a tree of files (what a ``pip install`` leaves: a few MiB in many
files, with their checksums); a SandboxSnapshot of it becomes Ready on its node
with its image, digest and size; 20 sandboxes forked from it (``spec.snapshotRef``)
are placed on that node and each sees the whole tree (checked in the sandbox by
``md5sum -c``, and from the node). Deleting the snapshot waits while any fork is
live, the node's forced image collection keeps its image meanwhile, and the last
fork gone, the object goes and the next collection removes the image.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import SNAPSHOT_FINALIZER
from sandlot.client import AsyncClient, Client, CommandError
from tests.integration.test_agent_pause import paused_condition, set_mode
from tests.integration.test_agent_suspend import condition
from tests.support.pools import IMAGE, Cluster, Start, phase, start_operator
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


FORKS = 20
FILES = 48
FILE_KIB = 128  # 48 x 128 KiB: 6 MiB of "installed packages"
PREPARE = [
    "sh",
    "-c",
    "mkdir -p /opt/venv/lib && cd /opt/venv && "
    f"for i in $(seq 1 {FILES}); do head -c {FILE_KIB * 1024} /dev/urandom > lib/mod$i.so; done"
    " && md5sum lib/*.so > SUMS && echo done > READY; "
    'trap "exit 143" TERM; sleep 1000 & wait',
]
CHECK = [
    "sh",
    "-c",
    "cd /opt/venv && md5sum -c SUMS > /tmp/check 2>&1; echo $? > /tmp/rc; "
    'trap "exit 143" TERM; sleep 1000 & wait',
]
SNAPSHOTS = "sandboxsnapshots"
SLEEP = ["sh", "-c", 'trap "exit 143" TERM; sleep 1000 & wait']


def create(c: Cluster, plural: str, kind: str, name: str, spec: dict[str, Any]) -> None:
    c.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        c.namespace,
        plural,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        },
    )


def read(c: Cluster, plural: str, name: str) -> dict[str, Any] | None:
    try:
        return dict(c.objs.get_namespaced_custom_object(GROUP, VERSION, c.namespace, plural, name))
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def delete(c: Cluster, plural: str, name: str) -> None:
    c.objs.delete_namespaced_custom_object(GROUP, VERSION, c.namespace, plural, name)


def wait_running(c: Cluster, name: str, timeout: float = 60) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = read(c, "sandboxes", name)
        return body if body is not None and phase(body) == "Running" else None

    return wait_for(probe, timeout=timeout, what=f"sandbox {name} Running")


def in_sandbox(sb: dict[str, Any], path: str) -> Path:
    """A path inside a running sandbox, through its process's root."""
    return Path(f"/proc/{sb['status']['pid']}/root") / path.lstrip("/")


@pytest.fixture
def unheld(cluster: Cluster) -> Iterator[None]:
    """Whatever happens, no snapshot of this test keeps its finalizer afterwards."""
    yield
    for item in cluster.objs.list_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, SNAPSHOTS
    )["items"]:
        name = item["metadata"]["name"]
        cluster.objs.patch_namespaced_custom_object(
            GROUP, VERSION, cluster.namespace, SNAPSHOTS, name, {"metadata": {"finalizers": None}}
        )
        delete(cluster, SNAPSHOTS, name)


def test_twenty_forks_see_the_prepared_tree_and_keep_the_snapshot(
    cluster: Cluster, operators: Start, unheld: None
) -> None:
    node = cluster.add_node("a", capacity=FORKS + 2)
    start_operator(cluster, operators)
    create(cluster, "sandboxes", "Sandbox", "prep", {"image": IMAGE, "command": PREPARE})
    prep = wait_running(cluster, "prep")
    wait_for(
        lambda: in_sandbox(prep, "/opt/venv/READY").exists(),
        timeout=60,
        what="the prepared tree in sandbox prep",
    )
    sums = in_sandbox(prep, "/opt/venv/SUMS").read_text()
    assert len(sums.splitlines()) == FILES

    create(cluster, SNAPSHOTS, "SandboxSnapshot", "prepared", {"sandboxName": "prep"})

    def ready() -> dict[str, Any] | None:
        body = read(cluster, SNAPSHOTS, "prepared")
        status = (body or {}).get("status") or {}
        assert status.get("phase") != "Failed", status
        return body if status.get("phase") == "Ready" else None

    snapshot = wait_for(ready, timeout=120, what="snapshot prepared Ready")
    status, image = snapshot["status"], snapshot["status"]["imageRef"]
    assert snapshot["spec"]["nodeName"] == node.name
    assert SNAPSHOT_FINALIZER in snapshot["metadata"]["finalizers"]
    assert image == f"sandlot.local/snapshots/{snapshot['metadata']['uid']}:latest"
    assert status["digest"].startswith("sha256:") and status["takenAt"]
    assert status["sizeBytes"] >= FILES * FILE_KIB * 1024, status
    assert node.runtime is not None
    assert image in {i.name for i in node.runtime.list_images(timeout=10)}
    assert phase(read(cluster, "sandboxes", "prep") or {}) == "Running"
    assert node.tasks()[prep["status"]["containerId"]].value == "running", "frozen after the take"

    forks = [f"fork-{i}" for i in range(FORKS)]
    for name in forks:
        spec = {"image": IMAGE, "command": CHECK, "snapshotRef": {"name": "prepared"}}
        create(cluster, "sandboxes", "Sandbox", name, spec)
    running = [wait_running(cluster, name, timeout=180) for name in forks]
    for sb in running:
        assert sb["spec"]["nodeName"] == node.name
        rc = wait_for(
            partial(
                lambda sb: (p := in_sandbox(sb, "/tmp/rc")).exists() and p.read_text().strip(), sb
            ),
            timeout=60,
            what=f"the tree check in {sb['metadata']['name']}",
        )
        assert rc == "0", in_sandbox(sb, "/tmp/check").read_text()
        assert in_sandbox(sb, "/opt/venv/SUMS").read_text() == sums

    delete(cluster, "sandboxes", "prep")  # the source goes; the snapshot does not need it
    delete(cluster, SNAPSHOTS, "prepared")
    agent = node.agent
    assert agent is not None and agent.collector is not None
    agent.collector.disabled = False  # the pool agents run without one: passes on demand here
    for keeper in forks:
        held = read(cluster, SNAPSHOTS, "prepared")
        assert held is not None and held["metadata"].get("deletionTimestamp"), held
        assert SNAPSHOT_FINALIZER in held["metadata"]["finalizers"]
        assert agent.collector.run_forced().error is None
        assert image in {i.name for i in node.runtime.list_images(timeout=10)}, keeper
        delete(cluster, "sandboxes", keeper)
        wait_for(
            partial(lambda k: read(cluster, "sandboxes", k) is None, keeper),
            timeout=30,
            what=f"sandbox {keeper} deleted",
        )

    wait_for(
        lambda: read(cluster, SNAPSHOTS, "prepared") is None,
        timeout=30,
        what="the unreferenced snapshot to go",
    )
    key = f"{cluster.namespace}/prepared"
    wait_for(
        lambda: agent.snapshot_watch.get(key) is None,
        timeout=15,
        what="the agent's watch to see the snapshot gone",
    )
    assert agent.collector.run_watermark().error is None
    assert image not in {i.name for i in node.runtime.list_images(timeout=10)}


def wait_snapshot(c: Cluster, name: str, timeout: float = 60) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        body = read(c, SNAPSHOTS, name)
        status = (body or {}).get("status") or {}
        assert status.get("phase") != "Failed", status
        return body if status.get("phase") == "Ready" else None

    return wait_for(probe, timeout=timeout, what=f"snapshot {name} Ready")


def test_a_paused_sandbox_stays_paused_and_a_suspended_ones_state_forks(
    cluster: Cluster, operators: Start, unheld: None
) -> None:
    node = cluster.add_node("a", capacity=4)
    start_operator(cluster, operators)
    write = ["sh", "-c", 'echo prepared > /kept; trap "exit 143" TERM; sleep 1000 & wait']
    create(cluster, "sandboxes", "Sandbox", "src", {"image": IMAGE, "command": write})
    src = wait_running(cluster, "src")
    wait_for(lambda: in_sandbox(src, "/kept").exists(), timeout=30, what="the file in src")

    set_mode(cluster.kube, cluster.namespace, "src", "Paused")
    wait_for(
        lambda: (paused_condition(read(cluster, "sandboxes", "src")) or {}).get("status") == "True",
        timeout=30,
        what="src Paused",
    )
    create(cluster, SNAPSHOTS, "SandboxSnapshot", "of-paused", {"sandboxName": "src"})
    wait_snapshot(cluster, "of-paused")
    assert node.tasks()[src["status"]["containerId"]].value == "paused", "a take thawed it"

    set_mode(cluster.kube, cluster.namespace, "src", "Suspended")
    wait_for(
        lambda: (
            (condition(read(cluster, "sandboxes", "src"), "Suspended") or {}).get("status")
            == "True"
        ),
        timeout=60,
        what="src Suspended",
    )
    wait_for(
        lambda: src["status"]["containerId"] not in node.containers(),
        timeout=30,
        what="src's container removed",
    )
    create(cluster, SNAPSHOTS, "SandboxSnapshot", "of-suspended", {"sandboxName": "src"})
    taken = wait_snapshot(cluster, "of-suspended")
    assert taken["status"]["imageRef"] != (read(cluster, SNAPSHOTS, "of-paused") or {}).get(
        "status", {}
    ).get("imageRef")

    for snapshot in ("of-paused", "of-suspended"):
        fork = f"from-{snapshot}"
        spec = {"image": IMAGE, "command": SLEEP, "snapshotRef": {"name": snapshot}}
        create(cluster, "sandboxes", "Sandbox", fork, spec)
        running = wait_running(cluster, fork)
        assert in_sandbox(running, "/kept").read_text() == "prepared\n", fork


def test_a_snapshot_of_a_missing_sandbox_fails(
    cluster: Cluster, operators: Start, unheld: None
) -> None:
    cluster.add_node("a", capacity=2)
    start_operator(cluster, operators)
    create(cluster, SNAPSHOTS, "SandboxSnapshot", "orphan", {"sandboxName": "nobody"})

    def failed() -> dict[str, Any] | None:
        status = (read(cluster, SNAPSHOTS, "orphan") or {}).get("status") or {}
        return status if status.get("phase") == "Failed" else None

    status = wait_for(failed, timeout=30, what="snapshot orphan Failed")
    assert status["reason"] == "SandboxNotFound" and "nobody" in status["message"], status
    delete(cluster, SNAPSHOTS, "orphan")  # nothing refers to it: it goes at once
    wait_for(lambda: read(cluster, SNAPSHOTS, "orphan") is None, timeout=30, what="orphan gone")


def test_a_program_snapshots_a_sandbox_and_forks_it_through_the_sdk(
    cluster: Cluster, operators: Start, unheld: None
) -> None:
    """``Sandbox.snapshot`` returns once the node has it; ``create(snapshot=...)``
    starts a fork with its files; the async twin too; a snapshot that fails raises
    naming why and leaves no object behind."""
    node = cluster.add_node("a", capacity=4)
    start_operator(cluster, operators)
    write = ["sh", "-c", 'echo from-sdk > /kept; trap "exit 143" TERM; sleep 1000 & wait']
    create(cluster, "sandboxes", "Sandbox", "sdk-src", {"image": IMAGE, "command": write})
    src = wait_running(cluster, "sdk-src")
    wait_for(lambda: in_sandbox(src, "/kept").exists(), timeout=30, what="the file in sdk-src")

    with Client(cluster.kubeconfig, namespace=cluster.namespace) as sdk:
        snap = sdk.get("sdk-src").snapshot("sdk-snap", timeout=120)
        assert (snap.phase, snap.node, snap.sandbox) == ("Ready", node.name, "sdk-src")
        assert snap.digest and snap.digest.startswith("sha256:")
        assert sdk.snapshot("sdk-snap").digest == snap.digest
        fork = sdk.create(IMAGE, SLEEP, name="sdk-fork", snapshot=snap, timeout=120)
        assert fork.body["spec"]["nodeName"] == node.name
        assert in_sandbox(fork.body, "/kept").read_text() == "from-sdk\n"

        doomed = sdk.get("sdk-fork")
        doomed.terminate()
        wait_for(
            lambda: read(cluster, "sandboxes", "sdk-fork") is None,
            timeout=30,
            what="sdk-fork deleted",
        )
        with pytest.raises(CommandError, match="SandboxNotFound"):
            doomed.snapshot("sdk-orphan", timeout=60)
        wait_for(  # deleted by the SDK; its finalizer goes once the operator sees that
            lambda: read(cluster, SNAPSHOTS, "sdk-orphan") is None,
            timeout=30,
            what="the failed snapshot the SDK made to go",
        )

    async def program() -> str:
        async with AsyncClient(cluster.kubeconfig, namespace=cluster.namespace) as sdk:
            taken = await (await sdk.get("sdk-src")).snapshot(timeout=120)
            made = await sdk.create(IMAGE, SLEEP, snapshot=taken.name, timeout=120)
            return in_sandbox(made.sync.body, "/kept").read_text()

    assert asyncio.run(asyncio.wait_for(program(), timeout=300)) == "from-sdk\n"
