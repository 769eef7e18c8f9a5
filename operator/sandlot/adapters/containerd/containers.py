"""Containers, tasks and snapshots over containerd's gRPC API.

Creating a container mirrors what containerd's Go client does, minus what the
agent does not use: resolve the image to its config (picking this platform's
manifest from an index), prepare a snapshot from the chain ID of its layers
under a short-lived lease (so a concurrent image delete cannot collect the
snapshot before the container record holds it), then create the record with
the caller's OCI spec and the ``rootfs`` root added. A spec that maps a user
namespace gets a snapshot of its own instead, the image's owners shifted into its
range (``remap``). A method that makes several RPCs spends one budget across all
of them.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any

from google.protobuf import any_pb2

from sandlot.adapters.containerd.connection import Connection, to_datetime
from sandlot.adapters.containerd.gen.services.containers.v1 import containers_pb2
from sandlot.adapters.containerd.gen.services.snapshots.v1 import snapshots_pb2
from sandlot.adapters.containerd.gen.services.tasks.v1 import tasks_pb2
from sandlot.adapters.containerd.gen.types.runc.options import oci_pb2
from sandlot.adapters.containerd.gen.types.task import task_pb2
from sandlot.adapters.containerd.images import Images
from sandlot.adapters.containerd.remap import ROOT_DIR, Remapper
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import (
    UNSUPPORTED,
    ContainerInfo,
    ContainerSpec,
    ExitStatus,
    NotFound,
    RuntimeError_,
    RuntimeTimeout,
    TaskInfo,
    TaskState,
)

DEFAULT_RUNTIME = "io.containerd.runc.v2"
DEFAULT_SNAPSHOTTER = "overlayfs"
SPEC_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Spec"
# containerd's typeurl registry names protobuf messages by their full name.
RUNC_OPTIONS_TYPE_URL = "containerd.runc.v1.Options"
# containerd's runtimeoptions.v1.Options (type_url = 1, config_path = 2): how CRI
# hands a shim of its own kind (gVisor's) the file of its options.
RUNTIME_OPTIONS_TYPE_URL = "runtimeoptions.v1.Options"
RUNSC_OPTIONS_TYPE = "io.containerd.runsc.v1.options"


def runtime_options(config_path: str, options_type: str = RUNSC_OPTIONS_TYPE) -> bytes:
    """``runtimeoptions.v1.Options{type_url, config_path}`` in protobuf's wire format."""

    def field(number: int, text: str) -> bytes:
        data, size, length = text.encode(), bytearray(), len(text.encode())
        while True:
            byte, length = length & 0x7F, length >> 7
            size.append(byte | (0x80 if length else 0))
            if not length:
                break
        return bytes([number << 3 | 2]) + bytes(size) + data

    return field(1, options_type) + field(2, config_path)


# A create lease outlives a crashed agent by this much, then containerd's GC drops it.
CREATE_LEASE_TTL = timedelta(hours=1)

_TASK_STATES = {
    task_pb2.UNKNOWN: TaskState.UNKNOWN,
    task_pb2.CREATED: TaskState.CREATED,
    task_pb2.RUNNING: TaskState.RUNNING,
    task_pb2.STOPPED: TaskState.STOPPED,
    task_pb2.PAUSED: TaskState.PAUSED,
    task_pb2.PAUSING: TaskState.PAUSING,
}


def chain_id(diff_ids: Sequence[str]) -> str:
    """The identity of a stack of layers, as the snapshotter names its committed snapshots."""
    if not diff_ids:
        raise ValueError("an image without layers has no chain ID")
    chain = diff_ids[0]
    for diff_id in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


def snapshot_gc_labels(snapshotter: str, chain: str) -> dict[str, str]:
    """An image config's label that keeps its unpacked snapshot from containerd's GC."""
    return {f"containerd.io/gc.ref.snapshot.{snapshotter}": chain}


def manifest_gc_labels(config_digest: str, layer_digests: Iterable[str]) -> dict[str, str]:
    """A manifest's labels that keep its config and its layers from containerd's GC."""
    labels = {"containerd.io/gc.ref.content.config": config_digest}
    for i, digest in enumerate(layer_digests):
        labels[f"containerd.io/gc.ref.content.l.{i}"] = digest
    return labels


def mapped_root(oci_spec: Mapping[str, Any]) -> int | None:
    """The host ID of the container's root when it has a user namespace (its root
    filesystem must then be owned by it, ``remap``); None without one."""
    for mapping in (oci_spec.get("linux") or {}).get("uidMappings") or []:
        if mapping.get("containerID") == 0:
            return int(mapping["hostID"])
    return None


class Containers:
    """The container, task and snapshot half of the ``Runtime``, on one ``Connection``."""

    def __init__(
        self, conn: Connection, images: Images, *, snapshotter: str, runtime_name: str
    ) -> None:
        self._conn = conn
        self._images = images
        self.snapshotter = snapshotter
        self.runtime_name = runtime_name

    # -- listings ------------------------------------------------------------------

    def list_containers(self, *, timeout: float) -> list[ContainerInfo]:
        response = self._conn.call(
            self._conn.containers.List,
            containers_pb2.ListContainersRequest(),
            timeout=timeout,
            what="Containers.List",
        )
        return [_container_info(c) for c in response.containers]

    def list_tasks(self, *, timeout: float) -> list[TaskInfo]:
        response = self._conn.call(
            self._conn.tasks.List, tasks_pb2.ListTasksRequest(), timeout=timeout, what="Tasks.List"
        )
        return [_task_info(p) for p in response.tasks]

    def get_task(self, container_id: str, *, timeout: float) -> TaskInfo | None:
        try:
            response = self._conn.call(
                self._conn.tasks.Get,
                tasks_pb2.GetRequest(container_id=container_id),
                timeout=timeout,
                what=f"Tasks.Get {container_id}",
            )
        except NotFound:
            return None
        return _task_info(response.process)

    def list_snapshots(self, *, timeout: float) -> list[str]:
        """Keys of the snapshots of this snapshotter (teardown checks and orphan sweeps)."""
        responses = self._conn.stream(
            self._conn.snapshots.List,
            snapshots_pb2.ListSnapshotsRequest(snapshotter=self.snapshotter),
            timeout=timeout,
            what=f"Snapshots.List ({self.snapshotter})",
        )
        return [info.name for response in responses for info in response.info]

    # -- create and start ----------------------------------------------------------

    def create_container(self, spec: ContainerSpec, *, timeout: float) -> ContainerInfo:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        config = self._images.config_json(spec.image, budget)
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        if not diff_ids:
            raise RuntimeError_(f"image {spec.image}: config lists no layers", code="invalid")
        parent = chain_id(diff_ids)

        oci_spec = copy.deepcopy(dict(spec.oci_spec))
        first_id = mapped_root(oci_spec)
        root = dict(oci_spec.get("root") or {})
        root["path"] = "rootfs" if first_id is None else f"rootfs/{ROOT_DIR}"
        oci_spec["root"] = root

        lease = self._conn.create_lease(f"sandlot-create-{spec.id}", CREATE_LEASE_TTL, budget)
        try:
            if first_id is None:
                self._prepare(spec, parent, budget, lease)
            else:
                layers = self._images.layers(spec.image, budget)
                Remapper(self._conn, self.snapshotter).prepare(
                    spec.id, layers, first_id, budget, lease
                )
            container = containers_pb2.Container(
                id=spec.id,
                image=spec.image,
                labels=dict(spec.labels),
                runtime=self._runtime_of(spec),
                spec=any_pb2.Any(
                    type_url=SPEC_TYPE_URL, value=json.dumps(oci_spec).encode("utf-8")
                ),
                snapshotter=self.snapshotter,
                snapshot_key=spec.id,
            )
            try:
                response = self._conn.call(
                    self._conn.containers.Create,
                    containers_pb2.CreateContainerRequest(container=container),
                    timeout=budget,
                    what=f"Containers.Create {spec.id}",
                    lease=lease,
                )
            except RuntimeError_:
                self._remove_snapshot_quietly(spec.id, budget)
                raise
        finally:
            self._conn.delete_lease_quietly(lease, budget)
        return _container_info(response.container)

    def _runtime_of(self, spec: ContainerSpec) -> Any:
        """The container's shim, and the runc shim's options when the handler names
        another OCI runtime binary (``BinaryName``, as containerd's CRI passes it)."""
        handler = spec.handler
        if handler is None:
            return containers_pb2.Container.Runtime(name=self.runtime_name)
        runtime = containers_pb2.Container.Runtime(name=handler.shim)
        if handler.binary_name:
            options = oci_pb2.Options(binary_name=handler.binary_name)
            runtime.options.CopyFrom(
                any_pb2.Any(type_url=RUNC_OPTIONS_TYPE_URL, value=options.SerializeToString())
            )
        elif handler.config_path:
            runtime.options.CopyFrom(
                any_pb2.Any(
                    type_url=RUNTIME_OPTIONS_TYPE_URL,
                    value=runtime_options(handler.config_path),
                )
            )
        return runtime

    def _prepare(self, spec: ContainerSpec, parent: str, budget: Deadline, lease: str) -> None:
        try:
            self._conn.call(
                self._conn.snapshots.Prepare,
                snapshots_pb2.PrepareSnapshotRequest(
                    snapshotter=self.snapshotter, key=spec.id, parent=parent
                ),
                timeout=budget,
                what=f"Snapshots.Prepare {spec.id} from image {spec.image}",
                lease=lease,
            )
        except NotFound as exc:
            raise NotFound(
                f"image {spec.image} is not unpacked for snapshotter {self.snapshotter} "
                f"(no snapshot {parent})"
            ) from exc

    def _remove_snapshot_quietly(self, key: str, budget: Deadline) -> None:
        with contextlib.suppress(RuntimeError_):
            self.remove_snapshot(key, timeout=budget.remaining(f"Snapshots.Remove {key}"))

    def start_task(self, container_id: str, *, stdio: str, timeout: float) -> TaskInfo:
        """Create the container's task, then start it: two operations of ``timeout``
        each. Creating spawns the shim and runs ``runc create``, the slow part under
        load; a start left with what creation did not spend would time out a task
        that is ready and throw its creation away."""
        budget = Deadline(timeout, expired=RuntimeTimeout)
        container = self._record(container_id, budget)
        mounts = self._mounts_of(container, budget)
        # The shim opens both: a FIFO (the agent reads it) or a file:// URI (append).
        request = tasks_pb2.CreateTaskRequest(
            container_id=container_id, rootfs=mounts, stdout=stdio, stderr=stdio
        )
        if container.runtime.options.type_url == RUNC_OPTIONS_TYPE_URL:
            # As containerd's Go client does for the runc shim: its options (the OCI
            # runtime binary) go with the task, which is where the shim reads them.
            # containerd 2.x takes no other kind there: another shim's options (the
            # runsc shim's ConfigPath) reach it from the container's runtime.
            request.options.CopyFrom(container.runtime.options)
        self._conn.call(
            self._conn.tasks.Create,
            request,
            timeout=budget,
            what=f"Tasks.Create {container_id}",
        )
        budget = Deadline(timeout, expired=RuntimeTimeout)
        try:
            started = self._conn.call(
                self._conn.tasks.Start,
                tasks_pb2.StartRequest(container_id=container_id),
                timeout=budget,
                what=f"Tasks.Start {container_id}",
            )
        except RuntimeError_:
            # A created task that never ran would otherwise hold the container.
            with contextlib.suppress(RuntimeError_):
                self.delete_task(container_id, timeout=budget.remaining("Tasks.Delete"))
            raise
        return TaskInfo(container_id=container_id, pid=started.pid, state=TaskState.RUNNING)

    def _mounts(self, container_id: str, budget: Deadline) -> Any:
        """The mounts of the container's root filesystem (its snapshot's)."""
        return self._mounts_of(self._record(container_id, budget), budget)

    def _record(self, container_id: str, budget: Deadline) -> Any:
        return self._conn.get_container(container_id, timeout=budget)

    def _mounts_of(self, container: Any, budget: Deadline) -> Any:
        container_id = container.id
        return self._conn.call(
            self._conn.snapshots.Mounts,
            snapshots_pb2.MountsRequest(
                snapshotter=container.snapshotter or self.snapshotter,
                key=container.snapshot_key,
            ),
            timeout=budget,
            what=f"Snapshots.Mounts {container.snapshot_key} for container {container_id}",
        ).mounts

    def writable_layer(self, container_id: str, *, timeout: float) -> str:
        """The directory holding what the container wrote to its root filesystem."""
        mounts = self._mounts(container_id, Deadline(timeout, expired=RuntimeTimeout))
        found = writable_dir(mounts)
        if found is None:
            kinds = ", ".join(m.type for m in mounts) or "none"
            raise RuntimeError_(
                f"container {container_id}: no writable directory in its mounts ({kinds})",
                code=UNSUPPORTED,
            )
        return found

    # -- stop and remove -----------------------------------------------------------

    def kill_task(self, container_id: str, signal: int, *, timeout: float) -> None:
        self._conn.call(
            self._conn.tasks.Kill,
            tasks_pb2.KillRequest(container_id=container_id, signal=signal),
            timeout=timeout,
            what=f"Tasks.Kill {container_id} signal {signal}",
        )

    def pause_task(self, container_id: str, *, timeout: float) -> None:
        self._conn.call(
            self._conn.tasks.Pause,
            tasks_pb2.PauseTaskRequest(container_id=container_id),
            timeout=timeout,
            what=f"Tasks.Pause {container_id}",
        )

    def resume_task(self, container_id: str, *, timeout: float) -> None:
        self._conn.call(
            self._conn.tasks.Resume,
            tasks_pb2.ResumeTaskRequest(container_id=container_id),
            timeout=timeout,
            what=f"Tasks.Resume {container_id}",
        )

    def wait_task(self, container_id: str, *, timeout: float) -> ExitStatus:
        response = self._conn.call(
            self._conn.tasks.Wait,
            tasks_pb2.WaitRequest(container_id=container_id),
            timeout=timeout,
            what=f"Tasks.Wait {container_id}",
        )
        return ExitStatus(code=response.exit_status, exited_at=to_datetime(response.exited_at))

    def delete_task(self, container_id: str, *, timeout: float) -> ExitStatus | None:
        """Delete a stopped task; its exit status, or None if it never exited (never ran)."""
        response = self._conn.call(
            self._conn.tasks.Delete,
            tasks_pb2.DeleteTaskRequest(container_id=container_id),
            timeout=timeout,
            what=f"Tasks.Delete {container_id}",
        )
        exited_at = to_datetime(response.exited_at)
        if exited_at is None:
            return None
        return ExitStatus(code=response.exit_status, exited_at=exited_at)

    def delete_container(self, container_id: str, *, timeout: float) -> None:
        self._conn.call(
            self._conn.containers.Delete,
            containers_pb2.DeleteContainerRequest(id=container_id),
            timeout=timeout,
            what=f"Containers.Delete {container_id}",
        )

    def remove_snapshot(self, key: str, *, timeout: float) -> None:
        self._conn.call(
            self._conn.snapshots.Remove,
            snapshots_pb2.RemoveSnapshotRequest(snapshotter=self.snapshotter, key=key),
            timeout=timeout,
            what=f"Snapshots.Remove {key} ({self.snapshotter})",
        )


def writable_dir(mounts: Sequence[Any]) -> str | None:
    """The writable directory of a snapshot's mounts: an overlay's ``upperdir``, or
    the source of a read-write bind (the overlayfs snapshotter's answer for a
    snapshot without a parent, and the native snapshotter's); None otherwise."""
    for mount in mounts:
        options = list(mount.options)
        if mount.type == "overlay":
            for option in options:
                if option.startswith("upperdir="):
                    return str(option.removeprefix("upperdir="))
        elif mount.type == "bind" and "ro" not in options:
            return str(mount.source)
    return None


def _container_info(container: Any) -> ContainerInfo:
    return ContainerInfo(
        id=container.id,
        image=container.image,
        labels=dict(container.labels),
        snapshot_key=container.snapshot_key,
        created_at=to_datetime(container.created_at),
    )


def _task_info(process: Any) -> TaskInfo:
    state = _TASK_STATES.get(process.status, TaskState.UNKNOWN)
    stopped = state == TaskState.STOPPED
    return TaskInfo(
        container_id=process.container_id or process.id,
        pid=process.pid,
        state=state,
        exit_status=process.exit_status if stopped else None,
        exited_at=to_datetime(process.exited_at) if stopped else None,
    )


__all__ = [
    "DEFAULT_RUNTIME",
    "DEFAULT_SNAPSHOTTER",
    "Containers",
    "chain_id",
    "mapped_root",
    "writable_dir",
]
