"""The agent's boundary to a container runtime: plain data in, plain data out.

``Runtime`` is the only way the agent touches containers and images. The real
implementation (``sandlot.adapters.containerd``) speaks containerd's gRPC API
and gives **every call a deadline**; tests of agent policy may use an in-memory
implementation of this protocol. Nothing here blocks without a bound: every
method takes ``timeout`` (seconds) and raises ``RuntimeTimeout`` when it passes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

# The image's run settings are read here and consumed by the pure spec builder.
from sandlot.policy.ocispec import ImageConfig as ImageConfig

# Task states are decided on (pause, resume, reap) in pure code.
from sandlot.policy.operatingmode import TaskState as TaskState

# A sandbox's runtime handler is chosen in pure code (its RuntimeClass).
from sandlot.policy.runtimeclass import RuntimeHandler as RuntimeHandler


class RuntimeError_(Exception):
    """A runtime call failed. ``code`` is a short machine word (``not_found``, ...)."""

    def __init__(self, message: str, code: str = "unknown") -> None:
        super().__init__(message)
        self.code = code


UNSUPPORTED = "unsupported"
"""``RuntimeError_.code`` of a question the runtime cannot answer for good (a
snapshotter without a writable directory)."""


class RuntimeTimeout(RuntimeError_):
    """A runtime call did not answer within its deadline."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="deadline_exceeded")


class NotFound(RuntimeError_):
    def __init__(self, message: str) -> None:
        super().__init__(message, code="not_found")


class ImageTooLarge(RuntimeError_):
    """Image or registry data past the cap on what is read of it (a hostile image):
    refused for good, the message naming the cap."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="too_large")


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    image: str
    labels: Mapping[str, str] = field(default_factory=dict)
    snapshot_key: str = ""
    created_at: datetime | None = None


@dataclass(frozen=True)
class TaskInfo:
    container_id: str
    pid: int
    state: TaskState
    exit_status: int | None = None
    exited_at: datetime | None = None


@dataclass(frozen=True)
class ImageRecord:
    """An image in the runtime's store, as the image collector sees it."""

    name: str
    size: int  # bytes of its content (manifest, config and layers)
    created_at: datetime
    updated_at: datetime
    labels: Mapping[str, str] = field(default_factory=dict)
    target_digest: str = ""


@dataclass(frozen=True)
class ContainerSpec:
    """What the agent asks the runtime to create.

    ``oci_spec`` is the full OCI runtime spec (a JSON-able dict) built by the
    agent; the runtime only adds the root filesystem from the image's snapshot.
    """

    id: str
    image: str
    oci_spec: Mapping[str, Any]
    labels: Mapping[str, str] = field(default_factory=dict)
    handler: RuntimeHandler | None = None
    """The runtime handler that runs it; None: the runtime's default (runc)."""


@dataclass(frozen=True)
class ExitStatus:
    code: int
    exited_at: datetime | None = None


class Runtime(Protocol):
    """Every method is bounded by ``timeout`` seconds."""

    def version(self, *, timeout: float) -> str: ...

    # containers and tasks
    def list_containers(self, *, timeout: float) -> list[ContainerInfo]: ...
    def list_tasks(self, *, timeout: float) -> list[TaskInfo]: ...
    def get_task(self, container_id: str, *, timeout: float) -> TaskInfo | None:
        """None only when containerd says there is no task; any failure raises."""
        ...

    def image_config(self, image: str, *, timeout: float) -> ImageConfig: ...
    def create_container(self, spec: ContainerSpec, *, timeout: float) -> ContainerInfo: ...
    def start_task(self, container_id: str, *, stdio: str, timeout: float) -> TaskInfo:
        """Create and start the container's task; each of the two gets ``timeout``.
        ``stdio`` is where its stdout and stderr go, as containerd takes it: a FIFO's
        path, a ``file://`` URI, or "" (nowhere)."""
        ...

    def kill_task(self, container_id: str, signal: int, *, timeout: float) -> None: ...
    def pause_task(self, container_id: str, *, timeout: float) -> None:
        """Freeze every process of the task (the cgroup freezer); memory is kept."""
        ...

    def resume_task(self, container_id: str, *, timeout: float) -> None:
        """Thaw a paused task: its processes run on where they were."""
        ...

    def wait_task(self, container_id: str, *, timeout: float) -> ExitStatus:
        """Wait for the task's exit; raises RuntimeTimeout if none arrives in time."""
        ...

    def delete_task(self, container_id: str, *, timeout: float) -> ExitStatus | None: ...
    def delete_container(self, container_id: str, *, timeout: float) -> None: ...
    def remove_snapshot(self, key: str, *, timeout: float) -> None: ...
    def commit_container(
        self, container_id: str, image: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        """Image ``image`` (created or replaced) holding the container's filesystem as
        it is now, unpacked on this node; its manifest's digest. ``RuntimeError_``
        with code ``UNSUPPORTED`` when its snapshot cannot be committed."""
        ...

    def copy_image(
        self, source: str, image: str, labels: Mapping[str, str], *, timeout: float
    ) -> str:
        """Image ``image`` (created or replaced) naming the same content as ``source``;
        its manifest's digest."""
        ...

    def image_manifest(self, image: str, *, timeout: float) -> tuple[bytes, str]:
        """The bytes and media type of the manifest image ``image`` names (as stored:
        what a push sends)."""
        ...

    def open_blob(self, digest: str, *, timeout: float) -> Iterator[bytes]:
        """A blob of the node's content store in chunks as they are read."""
        ...

    def writable_layer(self, container_id: str, *, timeout: float) -> str:
        """The directory holding what the container wrote to its root filesystem (its
        snapshot's overlay upper directory); ``RuntimeError_`` with code ``UNSUPPORTED``
        when its snapshotter has none."""
        ...

    # images
    def list_images(self, *, timeout: float) -> list[ImageRecord]: ...
    def delete_image(self, name: str, *, timeout: float) -> None:
        """Delete the record; its content stays on disk until ``collect_garbage``."""
        ...

    def collect_garbage(self, *, timeout: float) -> None:
        """Collect what no record, container or lease references; returns when it is gone."""
        ...

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None: ...

    def close(self) -> None: ...
