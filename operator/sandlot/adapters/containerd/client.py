"""``Runtime`` over containerd's gRPC API, with a deadline on every call.

One ``ContainerdRuntime`` is one channel to one containerd namespace. The work is
split by job: ``connection`` (the channel, deadlines, error translation, leases),
``images`` (configs, sizes, labels, deletes, garbage collection) and
``containers`` (containers, tasks, snapshots); this class only puts them
behind the ``Runtime`` protocol.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from google.protobuf import empty_pb2

from sandlot.adapters.containerd.commit import Committer
from sandlot.adapters.containerd.connection import Connection
from sandlot.adapters.containerd.containers import (
    DEFAULT_RUNTIME,
    DEFAULT_SNAPSHOTTER,
    Containers,
    chain_id,
)
from sandlot.adapters.containerd.images import Images
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import (
    ContainerInfo,
    ContainerSpec,
    ExitStatus,
    ImageConfig,
    ImageRecord,
    RuntimeTimeout,
    TaskInfo,
)


class ContainerdRuntime:
    """The agent's ``Runtime`` for one containerd namespace."""

    def __init__(
        self,
        address: str,
        namespace: str,
        *,
        snapshotter: str = DEFAULT_SNAPSHOTTER,
        runtime_name: str = DEFAULT_RUNTIME,
    ) -> None:
        self.address = address
        self.namespace = namespace
        self.snapshotter = snapshotter
        self.runtime_name = runtime_name
        self._conn = Connection(address, namespace)
        self._images = Images(self._conn)
        self._containers = Containers(
            self._conn, self._images, snapshotter=snapshotter, runtime_name=runtime_name
        )
        self._committer = Committer(self._conn, self._images, snapshotter)

    def version(self, *, timeout: float) -> str:
        response = self._conn.call(
            self._conn.version.Version, empty_pb2.Empty(), timeout=timeout, what="Version"
        )
        return str(response.version)

    # -- containers and tasks ------------------------------------------------------

    def list_containers(self, *, timeout: float) -> list[ContainerInfo]:
        return self._containers.list_containers(timeout=timeout)

    def list_tasks(self, *, timeout: float) -> list[TaskInfo]:
        return self._containers.list_tasks(timeout=timeout)

    def get_task(self, container_id: str, *, timeout: float) -> TaskInfo | None:
        return self._containers.get_task(container_id, timeout=timeout)

    def create_container(self, spec: ContainerSpec, *, timeout: float) -> ContainerInfo:
        return self._containers.create_container(spec, timeout=timeout)

    def start_task(self, container_id: str, *, stdio: str, timeout: float) -> TaskInfo:
        return self._containers.start_task(container_id, stdio=stdio, timeout=timeout)

    def kill_task(self, container_id: str, signal: int, *, timeout: float) -> None:
        self._containers.kill_task(container_id, signal, timeout=timeout)

    def pause_task(self, container_id: str, *, timeout: float) -> None:
        self._containers.pause_task(container_id, timeout=timeout)

    def resume_task(self, container_id: str, *, timeout: float) -> None:
        self._containers.resume_task(container_id, timeout=timeout)

    def wait_task(self, container_id: str, *, timeout: float) -> ExitStatus:
        return self._containers.wait_task(container_id, timeout=timeout)

    def delete_task(self, container_id: str, *, timeout: float) -> ExitStatus | None:
        return self._containers.delete_task(container_id, timeout=timeout)

    def delete_container(self, container_id: str, *, timeout: float) -> None:
        self._containers.delete_container(container_id, timeout=timeout)

    def commit_container(
        self, container_id: str, image: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        return self._committer.commit(container_id, image, labels, timeout=timeout)

    def copy_image(
        self, source: str, image: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        return self._committer.copy(source, image, labels, timeout=timeout)

    def image_manifest(self, image: str, *, timeout: float) -> tuple[bytes, str]:
        return self._images.stored_manifest(image, Deadline(timeout, expired=RuntimeTimeout))

    def open_blob(self, digest: str, *, timeout: float) -> Iterator[bytes]:
        return self._conn.open_blob(digest, timeout=timeout, what=f"blob {digest}")

    def remove_snapshot(self, key: str, *, timeout: float) -> None:
        self._containers.remove_snapshot(key, timeout=timeout)

    def list_snapshots(self, *, timeout: float) -> list[str]:
        return self._containers.list_snapshots(timeout=timeout)

    def writable_layer(self, container_id: str, *, timeout: float) -> str:
        return self._containers.writable_layer(container_id, timeout=timeout)

    # -- images --------------------------------------------------------------------

    def image_config(self, image: str, *, timeout: float) -> ImageConfig:
        return self._images.image_config(image, timeout=timeout)

    def list_images(self, *, timeout: float) -> list[ImageRecord]:
        return self._images.list_images(timeout=timeout)

    def delete_image(self, name: str, *, timeout: float) -> None:
        self._images.delete_image(name, timeout=timeout)

    def collect_garbage(self, *, timeout: float) -> None:
        self._images.collect_garbage(timeout=timeout)

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None:
        self._images.set_image_labels(name, labels, timeout=timeout)

    # -- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ContainerdRuntime:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


__all__ = ["ContainerdRuntime", "chain_id"]
