"""``Runtime`` over containerd's gRPC API, with a deadline on every call.

A wedged shim makes containerd calls about its task hang forever; the agent must
never hang with it. So every RPC here carries ``timeout=`` (a gRPC deadline),
and a method that makes several RPCs spends one budget across all of them.
gRPC status codes become the ``Runtime`` exceptions: ``DEADLINE_EXCEEDED`` is
``RuntimeTimeout``, ``NOT_FOUND`` is ``NotFound``, anything else is
``RuntimeError_`` naming the call and the container or image it was about.

One channel per ``ContainerdRuntime``; the namespace travels as the
``containerd-namespace`` metadata header on each call, as containerd expects.

Creating a container mirrors what containerd's Go client does, minus what the
agent does not use: resolve the image to its config (picking this platform's
manifest from an index), prepare a snapshot from the chain ID of its layers
under a short-lived lease (so a concurrent image delete cannot collect the
snapshot before the container record holds it), then create the record with
the caller's OCI spec and the ``rootfs`` root added.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import platform
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf import any_pb2, empty_pb2, field_mask_pb2, timestamp_pb2

from sandlot.adapters.containerd.imagefiles import read_image_files
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import (
    ContainerInfo,
    ContainerSpec,
    ExitStatus,
    ImageConfig,
    ImageRecord,
    NotFound,
    RuntimeError_,
    RuntimeTimeout,
    TaskInfo,
    TaskState,
)
from sandlot.policy.imageuser import needs_lookup

try:
    from sandlot.adapters.containerd.gen.services.containers.v1 import (
        containers_pb2,
        containers_pb2_grpc,
    )
    from sandlot.adapters.containerd.gen.services.content.v1 import content_pb2, content_pb2_grpc
    from sandlot.adapters.containerd.gen.services.images.v1 import images_pb2, images_pb2_grpc
    from sandlot.adapters.containerd.gen.services.leases.v1 import leases_pb2, leases_pb2_grpc
    from sandlot.adapters.containerd.gen.services.snapshots.v1 import (
        snapshots_pb2,
        snapshots_pb2_grpc,
    )
    from sandlot.adapters.containerd.gen.services.tasks.v1 import tasks_pb2, tasks_pb2_grpc
    from sandlot.adapters.containerd.gen.services.version.v1 import version_pb2_grpc
    from sandlot.adapters.containerd.gen.types.task import task_pb2
except ImportError as exc:  # pragma: no cover - depends on the setup step
    raise ImportError(
        "containerd gRPC stubs are not generated; run "
        "`python -m sandlot.devtools.gen_stubs` (see its docstring)"
    ) from exc

DEFAULT_RUNTIME = "io.containerd.runc.v2"
DEFAULT_SNAPSHOTTER = "overlayfs"
SPEC_TYPE_URL = "types.containerd.io/opencontainers/runtime-spec/1/Spec"
NAMESPACE_HEADER = "containerd-namespace"
LEASE_HEADER = "containerd-lease"
# A create lease outlives a crashed agent by this much, then containerd's GC drops it.
CREATE_LEASE_TTL = timedelta(hours=1)

INDEX_MEDIA_TYPES = frozenset(
    {
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
    }
)

_TASK_STATES = {
    task_pb2.UNKNOWN: TaskState.UNKNOWN,
    task_pb2.CREATED: TaskState.CREATED,
    task_pb2.RUNNING: TaskState.RUNNING,
    task_pb2.STOPPED: TaskState.STOPPED,
    task_pb2.PAUSED: TaskState.PAUSED,
    task_pb2.PAUSING: TaskState.PAUSING,
}
_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

T = TypeVar("T")


def host_architecture() -> str:
    machine = platform.machine().lower()
    return _GOARCH.get(machine, machine)


def chain_id(diff_ids: Sequence[str]) -> str:
    """The identity of a stack of layers, as the snapshotter names its committed snapshots."""
    if not diff_ids:
        raise ValueError("an image without layers has no chain ID")
    chain = diff_ids[0]
    for diff_id in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff_id}".encode()).hexdigest()
    return chain


def _to_datetime(ts: timestamp_pb2.Timestamp) -> datetime | None:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=UTC)


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _translate(exc: grpc.RpcError, what: str, timeout: float) -> RuntimeError_:
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    # containerd propagates the deadline to its shim call and may answer first, with
    # the Go context's error wrapped as UNKNOWN ("context deadline exceeded").
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
        code == grpc.StatusCode.UNKNOWN and "context deadline exceeded" in details
    ):
        return RuntimeTimeout(f"{what}: no answer from containerd within {timeout:g}s")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(f"{what}: not found ({details})")
    return RuntimeError_(f"{what}: {code.name} ({details})", code=code.name.lower())


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
        target = address if "://" in address or address.startswith("unix:") else f"unix://{address}"
        self._channel = grpc.insecure_channel(
            target, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        )
        self._metadata: tuple[tuple[str, str], ...] = ((NAMESPACE_HEADER, namespace),)
        self._version = version_pb2_grpc.VersionStub(self._channel)
        self._containers = containers_pb2_grpc.ContainersStub(self._channel)
        self._tasks = tasks_pb2_grpc.TasksStub(self._channel)
        self._images = images_pb2_grpc.ImagesStub(self._channel)
        self._content = content_pb2_grpc.ContentStub(self._channel)
        self._snapshots = snapshots_pb2_grpc.SnapshotsStub(self._channel)
        self._leases = leases_pb2_grpc.LeasesStub(self._channel)
        # Blobs referenced by a manifest or index, by its digest: content is immutable.
        self._blob_cache: dict[str, dict[str, int]] = {}

    # -- plumbing ------------------------------------------------------------------

    def _call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        timeout: float,
        what: str,
        lease: str = "",
    ) -> T:
        metadata = self._metadata + (((LEASE_HEADER, lease),) if lease else ())
        try:
            return method(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise _translate(exc, what, timeout) from exc

    def _read_blob(self, digest: str, *, timeout: float, what: str) -> bytes:
        request = content_pb2.ReadContentRequest(digest=digest)
        chunks: list[bytes] = []
        try:
            stream: Iterable[Any] = self._content.Read(
                request, timeout=timeout, metadata=self._metadata
            )
            for response in stream:
                chunks.append(response.data)
        except grpc.RpcError as exc:
            raise _translate(exc, f"{what}: read {digest}", timeout) from exc
        return b"".join(chunks)

    def _read_json(self, digest: str, budget: Deadline, what: str) -> dict[str, Any]:
        data = self._read_blob(digest, timeout=budget.remaining(what), what=what)
        try:
            parsed = json.loads(data)
        except ValueError as exc:
            raise RuntimeError_(f"{what}: blob {digest} is not JSON", code="invalid") from exc
        if not isinstance(parsed, dict):
            raise RuntimeError_(f"{what}: blob {digest} is not a JSON object", code="invalid")
        return parsed

    def _platform_manifest(
        self, image: str, descriptor: Mapping[str, Any], budget: Deadline
    ) -> dict[str, Any]:
        """The image manifest for linux/this architecture, resolving an index if needed."""
        what = f"image {image}"
        document = self._read_json(str(descriptor["digest"]), budget, what)
        media_type = descriptor.get("mediaType") or document.get("mediaType", "")
        if media_type not in INDEX_MEDIA_TYPES and "manifests" not in document:
            return document
        arch = host_architecture()
        for entry in document.get("manifests", []):
            plat = entry.get("platform") or {}
            if plat.get("os") == "linux" and plat.get("architecture") == arch:
                return self._platform_manifest(image, entry, budget)
        raise NotFound(f"{what}: no linux/{arch} manifest in its index")

    def _image_target(self, image: str, budget: Deadline) -> Any:
        what = f"Images.Get {image}"
        try:
            response = self._call(
                self._images.Get,
                images_pb2.GetImageRequest(name=image),
                timeout=budget.remaining(what),
                what=what,
            )
        except NotFound as exc:
            raise NotFound(f"image {image} not found in namespace {self.namespace}") from exc
        return response.image.target

    def _image_config_json(self, image: str, budget: Deadline) -> dict[str, Any]:
        target = self._image_target(image, budget)
        manifest = self._platform_manifest(
            image, {"digest": target.digest, "mediaType": target.media_type}, budget
        )
        config = manifest.get("config") or {}
        if "digest" not in config:
            raise RuntimeError_(f"image {image}: manifest has no config", code="invalid")
        return self._read_json(str(config["digest"]), budget, f"image {image} config")

    # -- Runtime -------------------------------------------------------------------

    def version(self, *, timeout: float) -> str:
        response = self._call(
            self._version.Version, empty_pb2.Empty(), timeout=timeout, what="Version"
        )
        return str(response.version)

    def list_containers(self, *, timeout: float) -> list[ContainerInfo]:
        response = self._call(
            self._containers.List,
            containers_pb2.ListContainersRequest(),
            timeout=timeout,
            what="Containers.List",
        )
        return [_container_info(c) for c in response.containers]

    def list_tasks(self, *, timeout: float) -> list[TaskInfo]:
        response = self._call(
            self._tasks.List, tasks_pb2.ListTasksRequest(), timeout=timeout, what="Tasks.List"
        )
        return [_task_info(p) for p in response.tasks]

    def get_task(self, container_id: str, *, timeout: float) -> TaskInfo | None:
        try:
            response = self._call(
                self._tasks.Get,
                tasks_pb2.GetRequest(container_id=container_id),
                timeout=timeout,
                what=f"Tasks.Get {container_id}",
            )
        except NotFound:
            return None
        return _task_info(response.process)

    def image_config(self, image: str, *, timeout: float) -> ImageConfig:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        config = self._image_config_json(image, budget).get("config") or {}
        user = str(config.get("User") or "")
        files = self._image_files(image, budget) if needs_lookup(user) else {}
        return ImageConfig(
            entrypoint=tuple(config.get("Entrypoint") or ()),
            cmd=tuple(config.get("Cmd") or ()),
            env=tuple(config.get("Env") or ()),
            working_dir=str(config.get("WorkingDir") or ""),
            user=user,
            passwd=files.get("/etc/passwd", ""),
            group=files.get("/etc/group", ""),
        )

    def _image_files(self, image: str, budget: Deadline) -> dict[str, str]:
        """The image's /etc/passwd and /etc/group, for a ``USER`` given by name."""
        target = self._image_target(image, budget)
        manifest = self._platform_manifest(
            image, {"digest": target.digest, "mediaType": target.media_type}, budget
        )
        what = f"image {image} layers"

        def read(digest: str) -> bytes:
            return self._read_blob(digest, timeout=budget.remaining(what), what=what)

        return read_image_files(manifest.get("layers") or [], read, ("/etc/passwd", "/etc/group"))

    def create_container(self, spec: ContainerSpec, *, timeout: float) -> ContainerInfo:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        config = self._image_config_json(spec.image, budget)
        diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
        if not diff_ids:
            raise RuntimeError_(f"image {spec.image}: config lists no layers", code="invalid")
        parent = chain_id(diff_ids)

        oci_spec = copy.deepcopy(dict(spec.oci_spec))
        root = dict(oci_spec.get("root") or {})
        root["path"] = "rootfs"
        oci_spec["root"] = root

        lease = self._create_lease(f"sandlot-create-{spec.id}", budget)
        try:
            what = f"Snapshots.Prepare {spec.id} from image {spec.image}"
            try:
                self._call(
                    self._snapshots.Prepare,
                    snapshots_pb2.PrepareSnapshotRequest(
                        snapshotter=self.snapshotter, key=spec.id, parent=parent
                    ),
                    timeout=budget.remaining(what),
                    what=what,
                    lease=lease,
                )
            except NotFound as exc:
                raise NotFound(
                    f"image {spec.image} is not unpacked for snapshotter {self.snapshotter} "
                    f"(no snapshot {parent})"
                ) from exc
            container = containers_pb2.Container(
                id=spec.id,
                image=spec.image,
                labels=dict(spec.labels),
                runtime=containers_pb2.Container.Runtime(name=self.runtime_name),
                spec=any_pb2.Any(
                    type_url=SPEC_TYPE_URL, value=json.dumps(oci_spec).encode("utf-8")
                ),
                snapshotter=self.snapshotter,
                snapshot_key=spec.id,
            )
            what = f"Containers.Create {spec.id}"
            try:
                response = self._call(
                    self._containers.Create,
                    containers_pb2.CreateContainerRequest(container=container),
                    timeout=budget.remaining(what),
                    what=what,
                    lease=lease,
                )
            except RuntimeError_:
                self._remove_snapshot_quietly(spec.id, budget)
                raise
        finally:
            self._delete_lease(lease, budget)
        return _container_info(response.container)

    def _create_lease(self, lease_id: str, budget: Deadline) -> str:
        what = f"Leases.Create {lease_id}"
        expires = datetime.now(UTC) + CREATE_LEASE_TTL
        try:
            self._call(
                self._leases.Create,
                leases_pb2.CreateRequest(
                    id=lease_id, labels={"containerd.io/gc.expire": _rfc3339(expires)}
                ),
                timeout=budget.remaining(what),
                what=what,
            )
        except RuntimeError_ as exc:
            if exc.code != "already_exists":  # left by an attempt that crashed: reuse it
                raise
        return lease_id

    def _delete_lease(self, lease_id: str, budget: Deadline) -> None:
        # Best effort: an expired lease is collected by containerd anyway.
        with contextlib.suppress(RuntimeError_):
            self._call(
                self._leases.Delete,
                leases_pb2.DeleteRequest(id=lease_id),
                timeout=max(budget.remaining(f"Leases.Delete {lease_id}"), 0.0),
                what=f"Leases.Delete {lease_id}",
            )

    def _remove_snapshot_quietly(self, key: str, budget: Deadline) -> None:
        with contextlib.suppress(RuntimeError_):
            self.remove_snapshot(key, timeout=budget.remaining(f"Snapshots.Remove {key}"))

    def start_task(self, container_id: str, *, log_path: str, timeout: float) -> TaskInfo:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        what = f"Containers.Get {container_id}"
        container = self._call(
            self._containers.Get,
            containers_pb2.GetContainerRequest(id=container_id),
            timeout=budget.remaining(what),
            what=what,
        ).container
        what = f"Snapshots.Mounts {container.snapshot_key} for container {container_id}"
        mounts = self._call(
            self._snapshots.Mounts,
            snapshots_pb2.MountsRequest(
                snapshotter=container.snapshotter or self.snapshotter,
                key=container.snapshot_key,
            ),
            timeout=budget.remaining(what),
            what=what,
        ).mounts
        # The runc shim opens file:// URIs itself (append mode), and shares one
        # file when stdout and stderr name the same one.
        uri = f"file://{log_path}" if log_path else ""
        what = f"Tasks.Create {container_id}"
        self._call(
            self._tasks.Create,
            tasks_pb2.CreateTaskRequest(
                container_id=container_id, rootfs=mounts, stdout=uri, stderr=uri
            ),
            timeout=budget.remaining(what),
            what=what,
        )
        what = f"Tasks.Start {container_id}"
        try:
            started = self._call(
                self._tasks.Start,
                tasks_pb2.StartRequest(container_id=container_id),
                timeout=budget.remaining(what),
                what=what,
            )
        except RuntimeError_:
            # A created task that never ran would otherwise hold the container.
            with contextlib.suppress(RuntimeError_):
                self.delete_task(container_id, timeout=budget.remaining("Tasks.Delete"))
            raise
        return TaskInfo(container_id=container_id, pid=started.pid, state=TaskState.RUNNING)

    def kill_task(self, container_id: str, signal: int, *, timeout: float) -> None:
        self._call(
            self._tasks.Kill,
            tasks_pb2.KillRequest(container_id=container_id, signal=signal),
            timeout=timeout,
            what=f"Tasks.Kill {container_id} signal {signal}",
        )

    def wait_task(self, container_id: str, *, timeout: float) -> ExitStatus:
        response = self._call(
            self._tasks.Wait,
            tasks_pb2.WaitRequest(container_id=container_id),
            timeout=timeout,
            what=f"Tasks.Wait {container_id}",
        )
        return ExitStatus(code=response.exit_status, exited_at=_to_datetime(response.exited_at))

    def delete_task(self, container_id: str, *, timeout: float) -> ExitStatus | None:
        """Delete a stopped task; its exit status, or None if it never exited (never ran)."""
        response = self._call(
            self._tasks.Delete,
            tasks_pb2.DeleteTaskRequest(container_id=container_id),
            timeout=timeout,
            what=f"Tasks.Delete {container_id}",
        )
        exited_at = _to_datetime(response.exited_at)
        if exited_at is None:
            return None
        return ExitStatus(code=response.exit_status, exited_at=exited_at)

    def delete_container(self, container_id: str, *, timeout: float) -> None:
        self._call(
            self._containers.Delete,
            containers_pb2.DeleteContainerRequest(id=container_id),
            timeout=timeout,
            what=f"Containers.Delete {container_id}",
        )

    def remove_snapshot(self, key: str, *, timeout: float) -> None:
        self._call(
            self._snapshots.Remove,
            snapshots_pb2.RemoveSnapshotRequest(snapshotter=self.snapshotter, key=key),
            timeout=timeout,
            what=f"Snapshots.Remove {key} ({self.snapshotter})",
        )

    def list_snapshots(self, *, timeout: float) -> list[str]:
        """Keys of the snapshots of this snapshotter (teardown checks and orphan sweeps)."""
        keys: list[str] = []
        try:
            stream: Iterable[Any] = self._snapshots.List(
                snapshots_pb2.ListSnapshotsRequest(snapshotter=self.snapshotter),
                timeout=timeout,
                metadata=self._metadata,
            )
            for response in stream:
                keys.extend(info.name for info in response.info)
        except grpc.RpcError as exc:
            raise _translate(exc, f"Snapshots.List ({self.snapshotter})", timeout) from exc
        return keys

    def list_images(self, *, timeout: float) -> list[ImageRecord]:
        budget = Deadline(timeout, expired=RuntimeTimeout)
        what = "Images.List"
        response = self._call(
            self._images.List,
            images_pb2.ListImagesRequest(),
            timeout=budget.remaining(what),
            what=what,
        )
        records = []
        for image in response.images:
            created = _to_datetime(image.created_at) or datetime.fromtimestamp(0, UTC)
            records.append(
                ImageRecord(
                    name=image.name,
                    size=self._content_size(
                        image.name,
                        {
                            "digest": image.target.digest,
                            "mediaType": image.target.media_type,
                            "size": image.target.size,
                        },
                        budget,
                    ),
                    created_at=created,
                    updated_at=_to_datetime(image.updated_at) or created,
                    labels=dict(image.labels),
                    target_digest=image.target.digest,
                )
            )
        return records

    def _content_size(self, image: str, descriptor: Mapping[str, Any], budget: Deadline) -> int:
        """Bytes of the distinct blobs an image references that are in the content store."""
        blobs = self._referenced_blobs(image, descriptor, budget)
        return sum(blobs.values()) if blobs is not None else 0

    def _referenced_blobs(
        self, image: str, descriptor: Mapping[str, Any], budget: Deadline
    ) -> dict[str, int] | None:
        """Digest -> size of a manifest or index and all it references; None if it is absent.

        Cached by digest when complete (content is immutable); an index with a
        platform never fetched is not cached, since that content may arrive later.
        """
        digest = str(descriptor["digest"])
        if digest in self._blob_cache:
            return self._blob_cache[digest]
        try:
            document = self._read_json(digest, budget, f"size of image {image}")
        except NotFound:
            return None  # an index entry for a platform that was never fetched
        blobs = {digest: int(descriptor.get("size", 0))}
        complete = True
        if descriptor.get("mediaType") in INDEX_MEDIA_TYPES or "manifests" in document:
            for entry in document.get("manifests", []):
                child = self._referenced_blobs(image, entry, budget)
                if child is None:
                    complete = False
                else:
                    blobs.update(child)
        else:
            for ref in [document.get("config") or {}, *document.get("layers", [])]:
                if "digest" in ref:
                    blobs[str(ref["digest"])] = int(ref.get("size", 0))
        if complete:
            self._blob_cache[digest] = blobs
        return blobs

    def delete_image(self, name: str, *, timeout: float) -> None:
        self._call(
            self._images.Delete,
            images_pb2.DeleteImageRequest(name=name, sync=True),
            timeout=timeout,
            what=f"Images.Delete {name}",
        )

    def set_image_labels(self, name: str, labels: Mapping[str, str], *, timeout: float) -> None:
        """Set the given labels, keeping the others; an empty value removes that label."""
        if not labels:
            return
        self._call(
            self._images.Update,
            images_pb2.UpdateImageRequest(
                image=images_pb2.Image(name=name, labels=dict(labels)),
                update_mask=field_mask_pb2.FieldMask(paths=[f"labels.{k}" for k in labels]),
            ),
            timeout=timeout,
            what=f"Images.Update labels of {name}",
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> ContainerdRuntime:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _container_info(container: Any) -> ContainerInfo:
    return ContainerInfo(
        id=container.id,
        image=container.image,
        labels=dict(container.labels),
        snapshot_key=container.snapshot_key,
        created_at=_to_datetime(container.created_at),
    )


def _task_info(process: Any) -> TaskInfo:
    state = _TASK_STATES.get(process.status, TaskState.UNKNOWN)
    stopped = state == TaskState.STOPPED
    return TaskInfo(
        container_id=process.container_id or process.id,
        pid=process.pid,
        state=state,
        exit_status=process.exit_status if stopped else None,
        exited_at=_to_datetime(process.exited_at) if stopped else None,
    )
