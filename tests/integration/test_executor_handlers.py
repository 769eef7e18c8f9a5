"""The executor under each runtime handler, against a real agent, kube-apiserver and
containerd (both release lines): a crun sandbox gets the executor mounted and its
commands forked with the identity a runtime exec gives them; a gVisor sandbox
(containerd 2.x) has none, and its commands go through the runtime's exec,
counted as such."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.containerd.execs import open_execs
from sandlot.agent.metrics import AgentMetrics
from sandlot.agent.sandboxes import container_id_for
from sandlot.devtools.containerd import PrivateContainerd
from sandlot.devtools.controlplane import executor_path
from tests.integration.test_executor import IDENTITY, Rig
from tests.support import agents
from tests.support.containerd_fixtures import EVERY_CONTAINERD, LINE_2
from tests.support.runtimeclasses import IMAGE, HandlerRig, oci_runtime_list, runtime_class

pytestmark = [pytest.mark.integration, pytest.mark.containerd, EVERY_CONTAINERD]

SLEEP = "sleep 1000"


@pytest.fixture
def executor_rig(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> Iterator[HandlerRig]:
    """The runtime-handler rig's agent, with the executor placed on its node."""
    archive = agents.busybox_archive(tmp_path_factory, IMAGE)
    node = f"node-{uuid.uuid4().hex[:8]}"
    log_dir = tmp_path / "logs"
    with (
        agents.containerd_namespace(containerd, "ex", archive) as ctr_ns,
        agents.agent_fleet(containerd, ctr_ns, log_dir) as fleet,
    ):
        fleet.start(kube, namespace, node, capacity_memory="1Gi", executor=str(executor_path()))
        try:
            yield HandlerRig(kube, namespace, node, ctr_ns, log_dir)
        finally:
            agents.delete_node(kube, node)


def _rig(containerd: PrivateContainerd, rig: HandlerRig, name: str) -> Rig:
    container = container_id_for(rig.wait(name, "Running")["metadata"]["uid"])
    execs = open_execs(containerd.address, rig.ctr_ns, str(rig.log_dir.parent / "fifos"))
    return Rig(execs, container, AgentMetrics(CollectorRegistry()))


def test_a_crun_sandbox_s_commands_are_forked_by_its_executor_with_a_runtime_exec_s_identity(
    executor_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    with runtime_class(executor_rig.kube, "crun") as crun_class:
        name = executor_rig.run(SLEEP, runtimeClassName=crun_class)
        rig = _rig(containerd, executor_rig, name)
    try:
        assert rig.container in oci_runtime_list("crun", executor_rig.ctr_ns)
        forked = rig.out("sh", "-c", IDENTITY)
        runtime = rig.out("sh", "-c", IDENTITY, executor=False)
        assert rig.via("executor") == 1, "the command did not go through the executor"
        assert forked == runtime
        assert rig.run("sh", "-c", "exit 3").code() == 3
    finally:
        rig.executors.close()
        rig.execs.close()


@pytest.mark.containerd_lines(LINE_2)
def test_a_gvisor_sandbox_has_no_executor_and_its_commands_take_the_runtime_s_exec(
    executor_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    with runtime_class(executor_rig.kube, "gvisor") as gvisor_class:
        name = executor_rig.run(SLEEP, runtimeClassName=gvisor_class)
        rig = _rig(containerd, executor_rig, name)
    try:
        assert rig.out("sh", "-c", "uname -r").strip().endswith("gvisor")
        assert (rig.via("executor"), rig.via("runtime"), rig.fallbacks("absent")) == (0, 1, 1)
    finally:
        rig.executors.close()
        rig.execs.close()
