"""RuntimeClasses, and a real agent whose private containerd offers two handlers
(runc, and crun through the runc shim's ``BinaryName``), for the runtime handler
and runtime class tests. Load with ``pytest_plugins`` (tests/conftest.py does).

- ``runtime_class(kube, handler, **fields)``: a ``node.k8s.io/v1`` RuntimeClass
  of a fresh name for the block, deleted after.
- ``handler_rig`` (function): an agent started on its own node and containerd
  namespace (the busybox image imported), with ``run``/``wait``/``output`` for
  sandboxes bound to that node.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.containerd import PrivateContainerd
from tests.support import agents
from tests.support.wait import wait_for

IMAGE = "docker.io/sandlot/rc-busybox:test"
SHIM_RUNC_ROOT = Path("/run/containerd/runc")
"""Where the runc shim keeps its OCI runtime's state (``--root``), per namespace,
whichever binary it runs."""
SHIM_RUNSC_STATE = Path("/run/containerd/runsc")
"""Where gVisor's shim keeps runsc's state, per namespace."""
TERMINAL = ("Failed", "Stopped", "Dead")


@contextlib.contextmanager
def runtime_class(kube: client.ApiClient, handler: str, **fields: Any) -> Iterator[str]:
    """A RuntimeClass naming ``handler`` (and ``scheduling``/``overhead`` from
    ``fields``) for the block; yields its name."""
    name = f"rc-{handler}-{uuid.uuid4().hex[:6]}"
    api: Any = client.NodeV1Api(kube)  # the body as plain JSON
    body = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": handler,
        **fields,
    }
    api.create_runtime_class(body)
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            api.delete_runtime_class(name)


def oci_runtime_list(binary: str, ctr_ns: str) -> str:
    """``<binary> list`` over the runc shim's state for ``ctr_ns``: the containers
    that OCI runtime created there (each runtime reads only its own state files)."""
    import subprocess

    path = shutil.which(binary)
    assert path is not None, f"{binary} is not installed (scripts/bootstrap.sh installs it)"
    done = subprocess.run(
        [path, "--root", str(SHIM_RUNC_ROOT / ctr_ns), "list"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, f"{binary} list failed: {done.stderr}"
    return done.stdout


def runsc_list(ctr_ns: str) -> str:
    """``runsc list`` over gVisor's shim state for ``ctr_ns``."""
    import subprocess

    from sandlot.devtools.containerd import gvisor_bin_dir

    bin_dir = gvisor_bin_dir()
    assert bin_dir is not None, "gVisor is not built (make setup builds it)"
    done = subprocess.run(
        [str(bin_dir / "runsc"), "--root", str(SHIM_RUNSC_STATE / ctr_ns), "list"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, f"runsc list failed: {done.stderr}"
    return done.stdout


@dataclass
class HandlerRig:
    kube: client.ApiClient
    namespace: str
    node: str
    ctr_ns: str
    log_dir: Path

    def run(self, command: str, *, name: str | None = None, **spec: Any) -> str:
        """Create a sandbox bound to the rig's node running ``sh -c command``; its name."""
        name = name or f"sb-{uuid.uuid4().hex[:6]}"
        agents.schedule_sandbox(
            self.kube,
            self.namespace,
            name,
            self.node,
            {"image": IMAGE, "command": ["sh", "-c", command], **spec},
        )
        return name

    def get(self, name: str) -> dict[str, Any]:
        objs: Any = client.CustomObjectsApi(self.kube)
        return dict(
            objs.get_namespaced_custom_object(GROUP, VERSION, self.namespace, "sandboxes", name)
        )

    def sandbox_node(self) -> dict[str, Any]:
        objs: Any = client.CustomObjectsApi(self.kube)
        return dict(objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", self.node))

    def wait(self, name: str, *phases: str, timeout: float = 90) -> dict[str, Any]:
        """The sandbox once its phase is one of ``phases``; failing at once, with its
        status, when it ends in another terminal phase."""

        def reached() -> dict[str, Any] | None:
            sb = self.get(name)
            status = sb.get("status") or {}
            phase = status.get("phase")
            if phase not in phases and phase in TERMINAL:
                pytest.fail(f"sandbox {name} ended {phase}, not {'/'.join(phases)}: {status}")
            return sb if phase in phases else None

        return wait_for(reached, timeout=timeout, what=f"sandbox {name} to be {'/'.join(phases)}")

    def output(self, name: str, mark: str, *, timeout: float = 30) -> str:
        """The sandbox's log once it holds ``mark`` (the script's last line)."""
        uid = self.get(name)["metadata"]["uid"]

        def text() -> str | None:
            log = next(self.log_dir.glob(f"*_{uid}.log"), None)
            found = log.read_text(errors="replace") if log is not None else ""
            return found if mark in found else None

        return wait_for(text, timeout=timeout, what=f"{mark!r} in the log of {name}")


@pytest.fixture(scope="session")
def handler_rig_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return agents.busybox_archive(tmp_path_factory, IMAGE)


@pytest.fixture
def handler_rig(
    kube: client.ApiClient,
    namespace: str,
    containerd: PrivateContainerd,
    handler_rig_archive: Path,
    tmp_path: Path,
) -> Iterator[HandlerRig]:
    node = f"node-{uuid.uuid4().hex[:8]}"
    log_dir = tmp_path / "logs"
    with (
        agents.containerd_namespace(containerd, "rc", handler_rig_archive) as ctr_ns,
        agents.agent_fleet(containerd, ctr_ns, log_dir) as fleet,
    ):
        fleet.start(kube, namespace, node, capacity_memory="1Gi")
        try:
            yield HandlerRig(kube, namespace, node, ctr_ns, log_dir)
        finally:
            agents.delete_node(kube, node)
