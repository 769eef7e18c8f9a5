"""Real agents in tests: their settings (a private containerd, short durations, no
metrics port; tests pass only what differs), the containerd namespace each runs
in (an image imported, every container torn down after), and the agents a test
starts, all shut down at its end."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from sandlot.adapters.cni import CniError, Netns
from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.runtime import Runtime, RuntimeError_
from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings
from sandlot.agent.teardown import teardown_many
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.containerd import PrivateContainerd, start_private_containerd
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from sandlot.devtools.registry import LOOPBACK_HOSTS

NOT_ABOUT_DISK: dict[str, Any] = {"default_ephemeral_storage_limit": ""}
"""No node-wide disk limit for sandboxes that set none: a test not about disk must
not pass or fail by the size of its host's disk (the capacity counts those limits).
The tests about disk set their limits themselves."""


def agent_settings(
    *,
    node: str,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    log_dir: Path,
    **overrides: Any,
) -> AgentSettings:
    values: dict[str, Any] = {
        "node_name": node,
        "namespace": namespace,
        "containerd_address": containerd.address,
        "containerd_namespace": ctr_ns,
        "containerd_root": str(containerd.root),
        "containerd_config": str(containerd.config_path),
        "kill_wait": "2s",
        "call_timeout": "2s",
        "stop_grace": "2s",
        "reap_interval": "1s",
        "sync_interval": "0.3s",
        "lease_duration": "10s",
        "renew_interval": "1s",
        "metrics_port": 0,
        "node_address": "10.1.2.3",
        "log_dir": str(log_dir),
        "state_dir": str(log_dir.parent / "agent-state"),
        # Every test registry is on loopback: a private address, used only when listed.
        "registry_private_hosts": list(LOOPBACK_HOSTS),
        **NOT_ABOUT_DISK,
    }
    if "network_mode" not in overrides and "cni_conf_dir" not in overrides:
        # Whatever the host's /etc/cni/net.d holds (another tool's bridge), a test
        # agent networks as its test says: CNI only with a configuration it names.
        values["network_mode"] = "host-address"
    values.update(overrides)
    return AgentSettings(**values)


def busybox_archive(tmp_path_factory: pytest.TempPathFactory, image: str) -> Path:
    """An OCI archive of busybox named ``image``, built once per calling fixture."""
    path = tmp_path_factory.mktemp("agent-images") / "busybox.tar"
    build_image_archive(path, image)
    return path


def clear_namespace(containerd: PrivateContainerd, ctr_ns: str) -> None:
    """Tear down every container left in ``ctr_ns`` (each call bounded)."""
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    try:
        ids = [c.id for c in rt.list_containers(timeout=10)]
        teardown_many(rt, ids, kill_wait=3, call_timeout=3, concurrency=8)
        netns = Netns(timeout=10)
        for cid in ids:  # the agent's own namespaces (gVisor's loopback), not released here
            with contextlib.suppress(CniError):
                netns.delete(Netns.name_for(cid))
    except RuntimeError_:
        pass
    finally:
        rt.close()


@contextlib.contextmanager
def containerd_namespace(
    containerd: PrivateContainerd, prefix: str, archive: Path | None = None
) -> Iterator[str]:
    """A fresh containerd namespace (with ``archive`` imported, if given), cleared after."""
    ns = f"{prefix}-{uuid.uuid4().hex[:8]}"
    if archive is not None:
        import_archive(containerd.address, ns, archive, timeout=60)
    try:
        yield ns
    finally:
        clear_namespace(containerd, ns)


class AgentFleet:
    """The agents one test makes on one containerd namespace; ``close`` shuts every
    one down (their sandboxes keep running until the namespace is cleared).

    ``defaults`` are the module's settings over ``agent_settings``; a call's own
    overrides win over both."""

    def __init__(
        self, containerd: PrivateContainerd, ctr_ns: str, log_dir: Path, **defaults: Any
    ) -> None:
        self.containerd = containerd
        self.ctr_ns = ctr_ns
        self.log_dir = log_dir
        self.defaults = defaults
        self.agents: list[Agent] = []

    def make(
        self,
        api: client.ApiClient,
        namespace: str,
        node: str,
        *,
        runtime_factory: Callable[[], Runtime] | None = None,
        **overrides: Any,
    ) -> Agent:
        """An agent, not yet started."""
        settings = agent_settings(
            node=node,
            namespace=namespace,
            containerd=self.containerd,
            ctr_ns=self.ctr_ns,
            log_dir=self.log_dir,
            **{**self.defaults, **overrides},
        )
        agent = Agent(settings, api, registry=CollectorRegistry(), runtime_factory=runtime_factory)
        self.agents.append(agent)
        return agent

    def start(self, api: client.ApiClient, namespace: str, node: str, **overrides: Any) -> Agent:
        """An agent whose start-up finished: its node is READY."""
        agent = self.make(api, namespace, node, **overrides)
        assert agent.start(), "agent start-up failed"
        return agent

    def close(self) -> None:
        for agent in self.agents:
            agent.shutdown()


@contextlib.contextmanager
def agent_fleet(
    containerd: PrivateContainerd, ctr_ns: str, log_dir: Path, **defaults: Any
) -> Iterator[AgentFleet]:
    fleet = AgentFleet(containerd, ctr_ns, log_dir, **defaults)
    try:
        yield fleet
    finally:
        fleet.close()


def start_agent(
    stack: contextlib.ExitStack[Any],
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    archive: Path,
    log_dir: Path,
    prefix: str,
    node: str = "",
    **overrides: Any,
) -> Agent:
    """An in-process agent on a node and a containerd namespace of its own (holding
    ``archive``'s image), unwound by ``stack`` in reverse: the agent stops, its
    namespace is cleared, its SandboxNode goes."""
    node = node or f"node-{uuid.uuid4().hex[:8]}"
    stack.callback(delete_node, kube, node)
    ctr_ns = stack.enter_context(containerd_namespace(containerd, prefix, archive))
    fleet = stack.enter_context(agent_fleet(containerd, ctr_ns, log_dir))
    return fleet.start(kube, namespace, node, **overrides)


def agent_on_disk(
    stack: contextlib.ExitStack[Any],
    kube: client.ApiClient,
    namespace: str,
    disk: AbstractContextManager[Path],
    archive: Path,
    prefix: str,
    node: str,
    **overrides: Any,
) -> tuple[Path, Agent]:
    """``disk``'s mount and an agent (``start_agent``) on a private containerd whose
    root and logs are on it, unwound by ``stack``."""
    mount = stack.enter_context(disk)
    containerd = start_private_containerd(base=mount)
    stack.callback(containerd.stop)
    agent = start_agent(
        stack, kube, namespace, containerd, archive, mount / "logs", prefix, node, **overrides
    )
    return mount, agent


def delete_node(api: client.ApiClient, node: str) -> None:
    """Remove the SandboxNode an agent registered (already gone is fine)."""
    with contextlib.suppress(client.ApiException):
        client.CustomObjectsApi(api).delete_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", node
        )


def schedule_sandbox(
    api: client.ApiClient,
    namespace: str,
    name: str,
    node: str,
    spec: Mapping[str, Any],
    *,
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Create Sandbox ``name`` bound to ``node`` and mark it Scheduled, as the
    scheduler would: what an agent picks up. Returns the created object."""
    objs: Any = client.CustomObjectsApi(api)
    metadata: dict[str, Any] = {"name": name}
    if labels:
        metadata["labels"] = dict(labels)
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": metadata,
        "spec": {"nodeName": node, **spec},
    }
    created: dict[str, Any] = objs.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", body
    )
    # Scheduled only over a Sandbox that is still unstarted, as of the version read: an
    # agent that already saw it bound and decided (say Failed for want of room) is not
    # overwritten, which a terminal phase would refuse anyway; another writer's change
    # (a finalizer, a label) is read again and the write tried over it.
    current = created
    for _ in range(10):
        phase = (current.get("status") or {}).get("phase") or "Pending"
        if phase not in ("Pending", "Scheduled"):
            return created
        precondition = {"resourceVersion": current["metadata"]["resourceVersion"]}
        try:
            objs.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                "sandboxes",
                name,
                {"metadata": precondition, "status": {"phase": "Scheduled"}},
            )
            return created
        except client.ApiException as e:
            if e.status != 409:
                raise
        current = objs.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name)
    raise AssertionError(f"sandbox {namespace}/{name}: Scheduled not written in 10 tries")
