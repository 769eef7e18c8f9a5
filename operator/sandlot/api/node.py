"""SandboxNode: one per node running the agent; its health, capacity and GC state.

The agent owns ``status.capacity``, ``status.address`` and ``status.gc``; the
operator's node-health controller owns ``status.phase``, the conditions and
``status.health``. Health tracking lives here, not in operator memory, so an
operator restart or a leader change neither restarts nor forgets a grace period.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum

from pydantic import AwareDatetime, ConfigDict, Field

from sandlot.api.common import (
    AGE_COLUMN,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_WORD,
    NODES,
    Conditions,
    CrdInfo,
    Model,
    PrinterColumn,
    Resource,
)
from sandlot.api.placement import Taints


class NodePhase(StrEnum):
    READY = "Ready"
    NOT_READY = "NotReady"
    DISABLED = "Disabled"


class ReapRequest(Model):
    """An operator's decision that a NotReady node is lost (``sandlot nodes reap``).

    It names the unhealthy episode it was taken in, so it never outlives it: a node
    that renews its lease and is lost again needs a new decision.
    """

    unhealthy_since: AwareDatetime = Field(
        description="The node's status.health.unhealthySince when the decision was taken: "
        "the request applies while the node is NotReady in that same episode."
    )
    requested_at: AwareDatetime | None = Field(
        default=None, description="When it was requested (the requester's clock; for people)."
    )
    requested_by: str | None = Field(
        default=None, max_length=MAX_NAME, description="Who asked (for people)."
    )
    reason: str | None = Field(
        default=None, max_length=MAX_MESSAGE, description="Why, in the requester's words."
    )


class SandboxNodeSpec(Model):
    unschedulable: bool = Field(
        default=False,
        description="Set by `sandlot drain`: no new sandboxes go here and the agent stops "
        "the node's sandboxes gracefully. The node's phase becomes Disabled.",
    )
    taints: Taints = Field(
        default_factory=list,
        description="Taints set by hand (as `kubectl taint` on a Node): sandboxes that do "
        "not tolerate a NoSchedule or NoExecute taint are not placed here, and its agent "
        "refuses them when their nodeName was set by hand.",
    )
    reap: ReapRequest | None = Field(
        default=None,
        description="Set by `sandlot nodes reap`: an operator's decision that this NotReady "
        "node is lost. Its sandboxes are marked Dead (reason ManualReap) at once, even "
        "within the grace period or while the mass-failure guard holds; never on a node "
        "that is Ready or Disabled, nor in a later NotReady episode.",
    )


class NodeCapacity(Model):
    sandboxes: int = Field(
        default=0, ge=0, description="How many non-terminal sandboxes the node accepts."
    )
    memory: str | None = Field(
        default=None,
        max_length=64,
        description="Sum of the sandboxes' memory limits the node accepts (bytes, as a "
        "quantity): the agent's setting, else the node's memory.",
    )
    cpu: str | None = Field(
        default=None,
        max_length=64,
        description="Sum of the sandboxes' CPU limits the node accepts (a quantity), when "
        "the agent's setting bounds it.",
    )
    ephemeral_storage: str | None = Field(
        default=None,
        max_length=64,
        description="Sum of the sandboxes' ephemeral-storage limits the node accepts "
        "(bytes, as a quantity): the agent's setting, else its disk below the image "
        "collector's high watermark.",
    )


class ObservedRenewal(Model):
    """A renewal of a node's Lease as the operator saw it, timed on the operator's clock.

    ``renewTime`` and ``holderIdentity`` identify the renewal and are compared only for
    change: they are stamped by the agent's clock, which may be skewed.
    """

    model_config = ConfigDict(frozen=True)

    renew_time: str | None = Field(
        default=None,
        max_length=64,
        description="The Lease's spec.renewTime as written by the agent (compared for "
        "change only, never with a clock).",
    )
    holder_identity: str | None = Field(
        default=None, max_length=256, description="The Lease's spec.holderIdentity."
    )
    observed_at: AwareDatetime = Field(
        description="When the operator first saw this renewal, on its own clock."
    )
    lease_duration_seconds: int = Field(
        ge=0, description="The Lease's spec.leaseDurationSeconds at that renewal."
    )

    @property
    def expires_at(self) -> datetime:
        """When this renewal stops proving the node alive: observedAt + duration."""
        return self.observed_at + timedelta(seconds=self.lease_duration_seconds)

    def same_renewal(self, renew_time: str | None, holder: str | None) -> bool:
        return (self.renew_time, self.holder_identity) == (renew_time, holder)


class NodeHealthTracking(Model):
    unhealthy_since: datetime | None = Field(
        default=None,
        description="When the node stopped being Ready: the last renewal the operator "
        "observed plus its lease duration, on the operator's clock (not when the operator "
        "noticed). The grace period counts from here.",
    )
    last_renewal: ObservedRenewal | None = Field(
        default=None,
        description="The last renewal observed before this episode began; a restarted or "
        "new leader that finds the Lease unchanged keeps the episode and its deadline.",
    )
    handled_at: datetime | None = Field(
        default=None,
        description="When the node's sandboxes were all marked Dead after the grace "
        "period (the handled latch). Cleared when the node recovers, is drained or deleted.",
    )
    handled_count: int | None = Field(
        default=None, description="How many sandboxes that handling marked Dead."
    )


class HeldBackBytes(Model):
    in_use: int = Field(default=0, description="Bytes of images backing existing containers.")
    pinned: int = Field(default=0, description="Bytes of pinned images.")
    live_job: int = Field(default=0, description="Bytes of records under a live-job prefix.")
    too_young: int = Field(default=0, description="Bytes of images younger than minAge.")


class NodeGcStatus(Model):
    last_pass_time: datetime | None = Field(default=None, description="When the last pass ended.")
    last_pass_kind: str | None = Field(
        default=None,
        max_length=MAX_WORD,
        description="`watermark` (automatic or on request) or `forced`.",
    )
    last_pass_outcome: str | None = Field(
        default=None,
        max_length=MAX_WORD,
        description="`ok`, `nothing-to-do`, `exhausted`, `aborted` or `error`.",
    )
    records_removed: int = Field(default=0, description="Records the last pass removed.")
    bytes_freed: int = Field(
        default=0, description="Bytes freed by the last pass, measured on the filesystem."
    )
    held_back: HeldBackBytes = Field(
        default_factory=HeldBackBytes, description="What the last pass kept, by reason."
    )
    non_image_bytes: int = Field(
        default=0, description="Used bytes on containerd's filesystem that are not images."
    )
    disk_usage_percent: float | None = Field(
        default=None, description="Usage of containerd's filesystem after the last pass."
    )
    exhausted_until: datetime | None = Field(
        default=None,
        description="Automatic passes are skipped until then: everything evictable was "
        "gone and usage was still over the high mark.",
    )


MAX_RUNTIME_HANDLERS = 32


class NodeDiskStatus(Model):
    pressure: bool = Field(
        default=False,
        description="The node refuses new sandboxes: its disk (the fuller of containerd's "
        "root and the log directory) was at or over the image GC high watermark within "
        "the last `diskPressureTransition`.",
    )
    since: datetime | None = Field(
        default=None, description="When the node last went under pressure (null when not)."
    )
    usage_percent: float | None = Field(
        default=None, description="Usage of the fuller filesystem when last over the mark."
    )
    used_bytes: int | None = Field(default=None, description="Bytes used then.")
    capacity_bytes: int | None = Field(default=None, description="That filesystem's size.")
    message: str = Field(
        default="", max_length=MAX_MESSAGE, description="Why, in words (empty when not)."
    )


class NodeRuntimeHandler(Model):
    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="The handler's name, as a RuntimeClass's `handler` names it.",
    )


class SandboxNodeStatus(Model):
    phase: NodePhase = Field(
        default=NodePhase.NOT_READY,
        description="Ready while the node's lease is fresh; NotReady otherwise; Disabled "
        "when drained (spec.unschedulable).",
    )
    capacity: NodeCapacity = Field(
        default_factory=NodeCapacity, description="What the node accepts (written by its agent)."
    )
    sandboxes: int = Field(default=0, description="Non-terminal sandboxes on the node.")
    node_taints: Taints = Field(
        default_factory=list,
        description="The taints of the Kubernetes Node of the same name, mirrored by the "
        "agent (a control-plane node's `node-role.kubernetes.io/control-plane`). Placement "
        "counts them only for a SandboxNode with no Kubernetes Node.",
    )
    trusted_node_taints: Taints = Field(
        default_factory=list,
        description="The NoSchedule and NoExecute taints of the Kubernetes Node of the same "
        "name (not the node lifecycle's `node.kubernetes.io/` ones), copied by the operator; "
        "with no such Node, those of nodeTaints. The placement admission policy reads these "
        "and spec.taints. Only the operator writes them: an admission policy refuses its "
        "agent's changes.",
    )
    runtime_handlers: list[NodeRuntimeHandler] = Field(
        default_factory=list,
        max_length=MAX_RUNTIME_HANDLERS,
        description="The runtime handlers the node's containerd offers (as a Node's "
        "status.runtimeHandlers), found by its agent in containerd's CRI configuration: "
        "a runtime is listed only when its binaries exist; runc always is. A sandbox "
        "whose RuntimeClass names another handler is not placed here.",
    )
    address: str | None = Field(
        default=None, max_length=MAX_NAME, description="The node's address."
    )
    agent_version: str | None = Field(
        default=None, max_length=MAX_WORD, description="Version of its agent."
    )
    containerd_version: str | None = Field(
        default=None, max_length=MAX_WORD, description="Version of its containerd."
    )
    health: NodeHealthTracking = Field(
        default_factory=NodeHealthTracking, description="Node-health controller tracking."
    )
    gc: NodeGcStatus = Field(default_factory=NodeGcStatus, description="Image GC state.")
    disk: NodeDiskStatus = Field(
        default_factory=NodeDiskStatus,
        description="The node's disk pressure, written by its agent at registration and "
        "when pressure starts or ends; the node-health controller mirrors it into the "
        "`DiskPressure` condition, and the scheduler places nothing on such a node.",
    )
    conditions: Conditions = Field(default_factory=list, description="Conditions.")


class SandboxNode(Resource):
    crd = CrdInfo(
        kind="SandboxNode",
        plural=NODES,
        scope="Cluster",
        short_names=("snode",),
        columns=(
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Sandboxes", ".status.sandboxes", "integer"),
            AGE_COLUMN,
            PrinterColumn("Capacity", ".status.capacity.sandboxes", "integer", priority=1),
            PrinterColumn("Disk-Pressure", ".status.disk.pressure", "boolean", priority=1),
            PrinterColumn("Last-GC", ".status.gc.lastPassKind", priority=1),
            PrinterColumn("GC-Freed", ".status.gc.bytesFreed", "integer", priority=1),
            PrinterColumn("GC-Exhausted-Until", ".status.gc.exhaustedUntil", priority=1),
        ),
    )

    kind: str = "SandboxNode"
    spec: SandboxNodeSpec = Field(default_factory=SandboxNodeSpec)
    status: SandboxNodeStatus | None = None
