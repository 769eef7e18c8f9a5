"""SandboxSnapshot: a sandbox's filesystem as it was at one moment, to start others from.

The operator binds a new snapshot to its sandbox's node (``spec.nodeName``, as the
scheduler binds a Sandbox) and holds it with a finalizer while any Sandbox or pool
template names it in ``spec.snapshotRef``. The agent of that node takes it: the
writable layer committed to an image in the node's content store, frozen for the
length of the commit when the sandbox runs (``status.imageRef``). A Sandbox with
``spec.snapshotRef`` is placed on the snapshot's node and started from that image
("fork"). Deleting an unreferenced snapshot removes its image at the node's next
image collection.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import Field

from sandlot.api.common import (
    AGE_COLUMN,
    DNS_SUBDOMAIN,
    MAX_IMAGE,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_WORD,
    SNAPSHOTS,
    CrdInfo,
    Model,
    PrinterColumn,
    Resource,
)


class SnapshotPhase(StrEnum):
    """``status.phase`` of a SandboxSnapshot."""

    PENDING = "Pending"
    TAKING = "Taking"
    READY = "Ready"
    FAILED = "Failed"


TERMINAL_SNAPSHOT_PHASES: frozenset[str] = frozenset({SnapshotPhase.READY, SnapshotPhase.FAILED})


class SandboxSnapshotSpec(Model):
    sandbox_name: str = Field(
        min_length=1,
        max_length=MAX_NAME,
        description="The Sandbox (same namespace) whose filesystem is taken: Running, "
        "Paused or Suspended. Immutable.",
    )
    node_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN,
        description="The SandboxNode holding the snapshot: set by the operator to the "
        "sandbox's node; immutable once set. Selectable: `--field-selector spec.nodeName=N`.",
    )


class SandboxSnapshotStatus(Model):
    phase: SnapshotPhase = Field(
        default=SnapshotPhase.PENDING,
        description="Pending (not bound or not started), Taking, Ready or Failed. Ready "
        "and Failed are final.",
    )
    reason: str | None = Field(
        default=None, max_length=MAX_WORD, description="One CamelCase word for the phase."
    )
    message: str | None = Field(
        default=None, max_length=MAX_MESSAGE, description="Human-readable detail."
    )
    image_ref: str | None = Field(
        default=None,
        max_length=MAX_IMAGE,
        description="Where the snapshot is kept: an image in the content store of "
        "spec.nodeName (`sandlot.local/snapshots/<uid>:latest`). Sandboxes fork from this "
        "reference.",
    )
    digest: str | None = Field(
        default=None, max_length=MAX_WORD, description="The image's manifest digest."
    )
    pushed_image: str | None = Field(
        default=None,
        max_length=MAX_IMAGE,
        description="Where it was pushed (`<registry>/<repository>:snapshot-<uid>@<digest>`), "
        "when its node has a state repository: forks may then run on any node, which pulls "
        "it into its own store first.",
    )
    size_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Bytes of the committed writable layer (what the snapshot adds to "
        "its sandbox's image).",
    )
    taken_at: datetime | None = Field(default=None, description="When it became Ready.")


class SandboxSnapshot(Resource):
    crd = CrdInfo(
        kind="SandboxSnapshot",
        plural=SNAPSHOTS,
        scope="Namespaced",
        short_names=("sbsnap",),
        columns=(
            PrinterColumn("Sandbox", ".spec.sandboxName"),
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Node", ".spec.nodeName"),
            PrinterColumn("Size", ".status.sizeBytes", "integer"),
            AGE_COLUMN,
            PrinterColumn("Image", ".status.imageRef", priority=1),
            PrinterColumn("Digest", ".status.digest", priority=1),
            PrinterColumn("Reason", ".status.reason", priority=1),
        ),
        selectable_fields=(".spec.nodeName",),
        validations={
            "spec": [
                {
                    "rule": "self.sandboxName == oldSelf.sandboxName",
                    "message": "spec.sandboxName is immutable",
                    "reason": "FieldValueForbidden",
                },
                {
                    "rule": "!has(oldSelf.nodeName) || (has(self.nodeName) && self.nodeName == oldSelf.nodeName)",
                    "message": "spec.nodeName is immutable once set",
                    "reason": "FieldValueForbidden",
                },
            ],
        },
    )

    kind: str = "SandboxSnapshot"
    spec: SandboxSnapshotSpec
    status: SandboxSnapshotStatus | None = None


__all__ = [
    "TERMINAL_SNAPSHOT_PHASES",
    "SandboxSnapshot",
    "SandboxSnapshotSpec",
    "SandboxSnapshotStatus",
    "SnapshotPhase",
]
