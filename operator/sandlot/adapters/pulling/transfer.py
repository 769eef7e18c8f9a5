"""Pull through containerd's own Transfer service (containerd 2.x; 1.7 has it too).

The daemon resolves, fetches, unpacks and writes the image record; the agent names
the source (an ``OCIRegistry`` reference) and the destination (an ``ImageStore``:
the record's name and labels, this node's platform, the snapshotter to unpack
for), both as protobuf ``Any`` whose type URL is the bare message name, as
containerd's own client sends them. Two side channels run on the Streaming
service, each registered under an ID the request names:

- progress: containerd reports each blob's bytes as they land; the agent sums the
  config and layers (the bytes the client-side path counts) for the status;
- credentials: containerd asks for a registry's credential when the registry
  challenges it (``AuthRequest``); the agent answers with the pull's credential,
  and only on that stream, so it never sits in containerd's configuration.

Bounds. The per-pull deadline is the Transfer call's gRPC deadline. The stall
timeout is kept from the progress stream: when neither a byte nor an event arrived
for that long, the call is cancelled, and the daemon drops the fetch with it.

What is lost against the client-side path: the daemon's errors carry containerd's
words ("not found", "401 Unauthorized") rather than the registry's JSON error
codes, so the kind of failure is read from the gRPC code and those words.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import Message

from sandlot.adapters.containerd.connection import NAMESPACE_HEADER, translate
from sandlot.adapters.containerd.gen.services.streaming.v1 import (
    streaming_pb2,
    streaming_pb2_grpc,
)
from sandlot.adapters.containerd.gen.services.transfer.v1 import (
    transfer_pb2,
    transfer_pb2_grpc,
)
from sandlot.adapters.containerd.gen.types import platform_pb2
from sandlot.adapters.containerd.gen.types.transfer import (
    imagestore_pb2,
    progress_pb2,
    registry_pb2,
)
from sandlot.adapters.containerd.images import INDEX_MEDIA_TYPES, host_architecture
from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling.registry import Credential, RegistryError
from sandlot.adapters.pulling.steps import Progress
from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout
from sandlot.policy.pulling import FailureKind

# Blobs that are not counted: the index and manifests (the client-side path counts
# config and layers only, so both paths report the same total).
_MANIFEST_TYPES = INDEX_MEDIA_TYPES | {
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
}
# Events that carry a blob's fetched bytes (a layer fetched straight into its unpack
# reports "extracting"/"extracted" only); "already exists" ones were on the node.
_FETCH_EVENTS = frozenset({"waiting", "downloading", "complete", "extracting", "extracted"})
_PRESENT_EVENT = "already exists"
_WATCH_PERIOD = 0.2  # seconds between looks at the progress clock, while the call runs
_NO_ANSWER = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
_DRAIN_SECONDS = 5.0  # at most, for the progress events sent before the call returned


def pack(message: Message) -> any_pb2.Any:
    """``message`` as containerd's ``typeurl`` packs it: the bare full name as URL."""
    return any_pb2.Any(type_url=message.DESCRIPTOR.full_name, value=message.SerializeToString())


class _Stream:
    """One stream of the Streaming service, registered under ``stream_id``."""

    def __init__(
        self, stub: Any, stream_id: str, metadata: tuple[tuple[str, str], ...], timeout: float
    ) -> None:
        self.id = stream_id
        self._outbox: queue.Queue[any_pb2.Any | None] = queue.Queue()
        self._outbox.put(pack(streaming_pb2.StreamInit(id=stream_id)))
        self._responses = stub.Stream(
            iter(self._outbox.get, None), timeout=timeout, metadata=metadata
        )
        next(self._responses)  # containerd acknowledges once the ID is registered

    def send(self, message: Message) -> None:
        self._outbox.put(pack(message))

    def __iter__(self) -> Iterator[any_pb2.Any]:
        return iter(self._responses)

    def close(self) -> None:
        self._outbox.put(None)
        self._responses.cancel()


class _Tracker:
    """Bytes of config and layers by digest, and when anything last moved."""

    def __init__(self, progress: Progress | None) -> None:
        self._lock = threading.Lock()
        self._progress = progress
        self._blobs: dict[str, tuple[int, int, bool]] = {}  # digest: done, size, fetched
        self.moved = time.monotonic()

    def update(self, event: Any) -> None:
        with self._lock:
            self.moved = time.monotonic()
            desc = event.desc
            if not desc.digest or desc.media_type in _MANIFEST_TYPES:
                return
            if event.event == _PRESENT_EVENT:
                self._blobs[desc.digest] = (desc.size, desc.size, False)
            elif event.event in _FETCH_EVENTS:
                before, _, fetched = self._blobs.get(desc.digest, (0, 0, True))
                done = max(before, min(int(event.progress), desc.size))
                self._blobs[desc.digest] = (done, desc.size, fetched)
            else:
                return
            done, total = self.totals()[:2]
        if self._progress is not None:
            self._progress(done, total)

    def totals(self) -> tuple[int, int, int]:
        """Bytes done, bytes in all, bytes fetched."""
        blobs = self._blobs.values()
        return (
            sum(d for d, _, _ in blobs),
            sum(s for _, s, _ in blobs),
            sum(d for d, _, f in blobs if f),
        )

    def idle(self) -> float:
        with self._lock:
            return time.monotonic() - self.moved


class TransferNotOffered(RuntimeError_):
    """The daemon no longer serves the Transfer service (it was replaced)."""


def failure(exc: grpc.RpcError, what: str) -> RegistryError:
    """The daemon's refusal as a registry failure of the right kind."""
    code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = (exc.details() if isinstance(exc, grpc.Call) else None) or str(exc)
    words = details.lower()
    if code == grpc.StatusCode.NOT_FOUND or words.endswith(": not found"):
        return RegistryError(f"{what}: {details}", FailureKind.NOT_FOUND)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED) or any(
        sign in words for sign in ("401 unauthorized", "403 forbidden", "pull access denied")
    ):
        return RegistryError(f"{what}: {details}", FailureKind.UNAUTHORIZED)
    return RegistryError(f"{what}: {details}")


class TransferPull:
    """One pull through the Transfer service, on a channel the puller owns."""

    def __init__(
        self,
        channel: grpc.Channel,
        namespace: str,
        *,
        snapshotter: str,
        stall_timeout: float,
    ) -> None:
        self._transfer = transfer_pb2_grpc.TransferStub(channel)
        self._streaming = streaming_pb2_grpc.StreamingStub(channel)
        self._metadata: tuple[tuple[str, str], ...] = ((NAMESPACE_HEADER, namespace),)
        self.snapshotter = snapshotter
        self.stall_timeout = stall_timeout

    def offered(self, timeout: float) -> bool:
        """Whether the daemon serves the Transfer service: a request naming no known
        source is refused by a daemon that has it, and answered "unknown service"
        (UNIMPLEMENTED) by one that does not. No answer at all is no answer: it
        raises, and the question is asked again next time."""
        nothing = any_pb2.Any(type_url="sandlot.probe.None")
        try:
            self._transfer.Transfer(
                transfer_pb2.TransferRequest(source=nothing, destination=nothing),
                timeout=timeout,
                metadata=self._metadata,
            )
        except grpc.RpcError as exc:
            if _unknown_service(exc):
                return False
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code in _NO_ANSWER:
                raise translate(exc, "Transfer probe", timeout) from exc
        return True

    def pull(
        self,
        name: str,
        reference: str,
        scheme: str,
        credential: Credential | None,
        budget: Deadline,
        labels: Mapping[str, str],
        progress: Progress | None,
    ) -> tuple[int, int]:
        """Pull ``reference`` into the record ``name``; (bytes in all, bytes fetched)."""
        what = f"Transfer {reference}"
        tracker = _Tracker(progress)
        streams: list[_Stream] = []
        threads: list[threading.Thread] = []
        try:
            timeout = budget.remaining(what)
            try:
                watch = self._open(f"sandlot-progress-{uuid.uuid4().hex[:12]}", timeout, streams)
                resolver = registry_pb2.RegistryResolver(default_scheme=scheme)
                if credential is not None:
                    creds = self._open(f"sandlot-creds-{uuid.uuid4().hex[:12]}", timeout, streams)
                    threads.append(_daemon(self._answer, creds, credential))
                    resolver.auth_stream = creds.id
            except grpc.RpcError as exc:
                if _unknown_service(exc):
                    raise TransferNotOffered(f"{what}: {exc.details()}") from exc
                raise failure(exc, f"{what}: open a stream") from exc
            follower = _daemon(self._follow, watch, tracker)
            threads.append(follower)
            request = transfer_pb2.TransferRequest(
                source=pack(registry_pb2.OCIRegistry(reference=reference, resolver=resolver)),
                destination=pack(self._destination(name, labels)),
                options=transfer_pb2.TransferOptions(progress_stream=watch.id),
            )
            self._wait(request, budget, what, tracker)
            # The daemon ends the progress stream once the call returned; the events
            # still on their way are read first, so the last one says "all done".
            follower.join(timeout=min(_DRAIN_SECONDS, max(budget.remaining(what), 0.0)))
        finally:
            for stream in streams:
                stream.close()
            for thread in threads:
                thread.join(timeout=5)
        _, total, fetched = tracker.totals()
        return total, fetched

    def _open(self, stream_id: str, timeout: float, streams: list[_Stream]) -> _Stream:
        stream = _Stream(self._streaming, stream_id, self._metadata, timeout)
        streams.append(stream)
        return stream

    def _destination(self, name: str, labels: Mapping[str, str]) -> Message:
        platform = platform_pb2.Platform(os="linux", architecture=host_architecture())
        return imagestore_pb2.ImageStore(
            name=name,
            labels=dict(labels),
            platforms=[platform],
            unpacks=[
                imagestore_pb2.UnpackConfiguration(platform=platform, snapshotter=self.snapshotter)
            ],
        )

    def _wait(self, request: Any, budget: Deadline, what: str, tracker: _Tracker) -> None:
        """Run the call; cancel it once nothing moved for the stall timeout."""
        call = self._transfer.Transfer.future(
            request, timeout=budget.remaining(what), metadata=self._metadata
        )
        stalled = False
        while not call.done():
            try:
                call.result(timeout=_WATCH_PERIOD)
            except grpc.FutureTimeoutError:
                if tracker.idle() >= self.stall_timeout:
                    stalled = True
                    call.cancel()
            except grpc.RpcError:
                break
        if stalled:
            raise RegistryError(f"{what}: no bytes for {self.stall_timeout:g}s (stalled)")
        try:
            call.result()
        except grpc.RpcError as exc:
            if _unknown_service(exc):  # the daemon was replaced by one without it
                raise TransferNotOffered(f"{what}: {exc.details()}") from exc
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise RuntimeTimeout(
                    f"{budget.what}: {what}: deadline of {budget.seconds:g}s passed"
                ) from exc
            raise failure(exc, what) from exc

    @staticmethod
    def _follow(stream: _Stream, tracker: _Tracker) -> None:
        try:
            for message in stream:
                event = progress_pb2.Progress()
                if _parse(message, event):
                    tracker.update(event)
        except grpc.RpcError:
            return  # the stream is cancelled when the pull ends

    @staticmethod
    def _answer(stream: _Stream, credential: Credential) -> None:
        """Answer each of the daemon's credential requests with the pull's credential."""
        answer = registry_pb2.AuthResponse(
            authType=registry_pb2.CREDENTIALS,
            username=credential.username,
            secret=credential.password,
        )
        try:
            for _ in stream:
                stream.send(answer)
        except grpc.RpcError:
            return


def _unknown_service(exc: grpc.RpcError) -> bool:
    if not isinstance(exc, grpc.Call) or exc.code() != grpc.StatusCode.UNIMPLEMENTED:
        return False
    return "unknown service" in (exc.details() or "")


def _parse(message: any_pb2.Any, into: Message) -> bool:
    """Fill ``into`` from ``message`` if it holds that type (bare or prefixed URL)."""
    if message.type_url.rsplit("/", 1)[-1] != into.DESCRIPTOR.full_name:
        return False
    into.ParseFromString(message.value)
    return True


def _daemon(target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True, name="sandlot-transfer")
    thread.start()
    return thread


__all__ = ["TransferNotOffered", "TransferPull", "failure", "pack"]
