"""One channel to containerd, and the deadline and error rules every call follows.

A wedged shim makes containerd calls about its task hang forever; the agent must
never hang with it. So every RPC made through ``Connection.call`` carries
``timeout=`` (a gRPC deadline). gRPC status codes become the ``Runtime``
exceptions: ``DEADLINE_EXCEEDED`` is ``RuntimeTimeout``, ``NOT_FOUND`` is
``NotFound``, anything else is ``RuntimeError_`` naming the call and the
container or image it was about.

The namespace travels as the ``containerd-namespace`` metadata header on each
call, as containerd expects; a call made under a lease adds ``containerd-lease``.
Leases live here because both halves of the runtime use them: a container's
snapshot is prepared under one, and a garbage collection is asked for by
deleting one synchronously.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import grpc
from google.protobuf import timestamp_pb2

from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import ImageTooLarge, NotFound, RuntimeError_, RuntimeTimeout
from sandlot.api.timestamps import rfc3339
from sandlot.policy.imagecaps import mib

try:
    from sandlot.adapters.containerd.gen.services.containers.v1 import (
        containers_pb2,
        containers_pb2_grpc,
    )
    from sandlot.adapters.containerd.gen.services.content.v1 import content_pb2, content_pb2_grpc
    from sandlot.adapters.containerd.gen.services.diff.v1 import diff_pb2_grpc
    from sandlot.adapters.containerd.gen.services.images.v1 import images_pb2_grpc
    from sandlot.adapters.containerd.gen.services.leases.v1 import leases_pb2, leases_pb2_grpc
    from sandlot.adapters.containerd.gen.services.snapshots.v1 import snapshots_pb2_grpc
    from sandlot.adapters.containerd.gen.services.tasks.v1 import tasks_pb2_grpc
    from sandlot.adapters.containerd.gen.services.version.v1 import version_pb2_grpc
except ImportError as exc:  # pragma: no cover - depends on the setup step
    raise ImportError(
        "containerd gRPC stubs are not generated; run "
        "`python -m sandlot.devtools.gen_stubs` (see its docstring)"
    ) from exc

NAMESPACE_HEADER = "containerd-namespace"
LEASE_HEADER = "containerd-lease"
GC_EXPIRE_LABEL = "containerd.io/gc.expire"

T = TypeVar("T")


def to_datetime(ts: timestamp_pb2.Timestamp) -> datetime | None:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    when: datetime = ts.ToDatetime(tzinfo=UTC)
    return when


def translate(
    exc: grpc.RpcError, what: str, timeout: float, elapsed: float | None = None
) -> RuntimeError_:
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    # containerd propagates the deadline to its shim call and may answer first, with
    # the Go context's error wrapped as UNKNOWN ("context deadline exceeded"); 2.x's
    # server may instead reset the stream (CANCELLED) as the deadline passes.
    ran_out = elapsed is not None and elapsed >= timeout
    if (
        code == grpc.StatusCode.DEADLINE_EXCEEDED
        or (code == grpc.StatusCode.UNKNOWN and "context deadline exceeded" in details)
        or (code == grpc.StatusCode.CANCELLED and ran_out)
    ):
        return RuntimeTimeout(f"{what}: no answer from containerd within {timeout:g}s")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(f"{what}: not found ({details})")
    return RuntimeError_(f"{what}: {code.name} ({details})", code=code.name.lower())


def grpc_target(address: str) -> str:
    """gRPC's target for containerd's ``address``: a socket path, or a URI as it is."""
    return address if "://" in address or address.startswith("unix:") else f"unix://{address}"


def json_object(data: bytes, digest: str, what: str) -> dict[str, Any]:
    """Blob ``digest``'s bytes as the JSON object they must be (``RuntimeError_`` else)."""
    try:
        parsed = json.loads(data)
    except ValueError as exc:
        raise RuntimeError_(f"{what}: blob {digest} is not JSON", code="invalid") from exc
    if not isinstance(parsed, dict):
        raise RuntimeError_(f"{what}: blob {digest} is not a JSON object", code="invalid")
    return parsed


class Connection:
    """The channel, the namespace header and one stub per containerd service."""

    def __init__(self, address: str, namespace: str) -> None:
        self.address = address
        self.namespace = namespace
        self._channel = grpc.insecure_channel(
            grpc_target(address), options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        )
        self._metadata: tuple[tuple[str, str], ...] = ((NAMESPACE_HEADER, namespace),)
        self.version = version_pb2_grpc.VersionStub(self._channel)
        self.containers = containers_pb2_grpc.ContainersStub(self._channel)
        self.tasks = tasks_pb2_grpc.TasksStub(self._channel)
        self.images = images_pb2_grpc.ImagesStub(self._channel)
        self.content = content_pb2_grpc.ContentStub(self._channel)
        self.snapshots = snapshots_pb2_grpc.SnapshotsStub(self._channel)
        self.leases = leases_pb2_grpc.LeasesStub(self._channel)
        self.diff = diff_pb2_grpc.DiffStub(self._channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The namespace header, for a streaming call made on a stub directly."""
        return self._metadata

    def call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        timeout: float | Deadline,
        what: str,
        lease: str = "",
    ) -> T:
        """``method(request)`` named ``what``, within ``timeout`` seconds or what is left
        of a budget shared by the steps of one operation."""
        if isinstance(timeout, Deadline):
            timeout = timeout.remaining(what)
        metadata = self._metadata + (((LEASE_HEADER, lease),) if lease else ())
        began = time.monotonic()
        try:
            return method(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            raise translate(exc, what, timeout, time.monotonic() - began) from exc

    def get_container(self, container_id: str, *, timeout: float | Deadline) -> Any:
        """containerd's record of ``container_id`` (its spec, image, runtime and
        snapshot), within ``timeout`` seconds or what is left of a shared budget."""
        return self.call(
            self.containers.Get,
            containers_pb2.GetContainerRequest(id=container_id),
            timeout=timeout,
            what=f"Containers.Get {container_id}",
        ).container

    def stream(
        self, method: Callable[..., Iterable[T]], request: Any, *, timeout: float, what: str
    ) -> list[T]:
        """Every response of a server-streaming call, under one deadline."""
        began = time.monotonic()
        try:
            return list(method(request, timeout=timeout, metadata=self._metadata))
        except grpc.RpcError as exc:
            raise translate(exc, what, timeout, time.monotonic() - began) from exc

    def open_blob(
        self, digest: str, *, timeout: float, what: str, limit: int | None = None
    ) -> Iterator[bytes]:
        """The blob's bytes in chunks as containerd sends them, under one deadline;
        with ``limit``, no more than that many (containerd is asked for one byte
        more, and ``ImageTooLarge`` raised if it comes). Closing the iterator
        cancels the call."""
        label = f"{what}: read {digest}"
        request = content_pb2.ReadContentRequest(
            digest=digest, size=limit + 1 if limit is not None else 0
        )
        began = time.monotonic()
        call = self.content.Read(request, timeout=timeout, metadata=self._metadata)
        got = 0
        try:
            for response in call:
                got += len(response.data)
                if limit is not None and got > limit:
                    raise ImageTooLarge(f"{label}: more than {mib(limit)}, the cap")
                yield response.data
        except grpc.RpcError as exc:
            raise translate(exc, label, timeout, time.monotonic() - began) from exc
        finally:
            call.cancel()

    def read_blob(self, digest: str, *, timeout: float, what: str, limit: int) -> bytes:
        """The whole blob, refused (``ImageTooLarge``) past ``limit`` bytes before more
        than that is held."""
        return b"".join(self.open_blob(digest, timeout=timeout, what=what, limit=limit))

    def read_json(self, digest: str, budget: Deadline, what: str, *, limit: int) -> dict[str, Any]:
        data = self.read_blob(digest, timeout=budget.remaining(what), what=what, limit=limit)
        return json_object(data, digest, what)

    def write_blob(
        self, requests: Iterable[Any], digest: str, lease: str, budget: Deadline
    ) -> None:
        """Write blob ``digest`` by its ``Content.Write`` requests, held by ``lease``; a
        blob already there (the same bytes written before) is as good as written."""
        what = f"Content.Write {digest}"
        timeout = budget.remaining(what)
        try:
            for _ in self.content.Write(
                iter(requests), timeout=timeout, metadata=(*self.metadata, (LEASE_HEADER, lease))
            ):
                pass
        except grpc.RpcError as exc:
            error = translate(exc, what, timeout)
            if error.code != "already_exists":
                raise error from exc

    def create_lease(self, lease_id: str, ttl: timedelta, budget: Deadline) -> str:
        """A lease that containerd's GC drops by itself ``ttl`` from now, should we crash."""
        expires = datetime.now(UTC) + ttl
        try:
            self.call(
                self.leases.Create,
                leases_pb2.CreateRequest(
                    id=lease_id, labels={GC_EXPIRE_LABEL: rfc3339(expires, "seconds")}
                ),
                timeout=budget,
                what=f"Leases.Create {lease_id}",
            )
        except RuntimeError_ as exc:
            if exc.code != "already_exists":  # left by an attempt that crashed: reuse it
                raise
        return lease_id

    def delete_lease(self, lease_id: str, *, timeout: float, sync: bool = False) -> None:
        """Delete a lease; with ``sync``, containerd collects garbage before it answers."""
        self.call(
            self.leases.Delete,
            leases_pb2.DeleteRequest(id=lease_id, sync=sync),
            timeout=timeout,
            what=f"Leases.Delete {lease_id}" + (" (sync)" if sync else ""),
        )

    def delete_lease_quietly(self, lease_id: str, budget: Deadline) -> None:
        # Best effort: an expired lease is collected by containerd anyway.
        with contextlib.suppress(RuntimeError_):
            self.delete_lease(
                lease_id, timeout=max(budget.remaining(f"Leases.Delete {lease_id}"), 0.0)
            )

    def close(self) -> None:
        self._channel.close()


__all__ = ["Connection", "grpc_target", "json_object", "to_datetime", "translate"]
