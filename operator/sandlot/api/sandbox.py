"""Sandbox: one container on one node. ``kubectl get sandboxes`` is the main view.

Phases move Pending -> Scheduled -> Running -> one of Stopped, Failed, Dead, and
the API server itself refuses a status update that leaves a terminal phase (a
CEL transition rule on ``status``), so no controller bug can resurrect a sandbox.

``spec.operatingMode`` is orthogonal to the phase: a paused or suspended sandbox
stays ``Running`` (its node and claim are its own still) and says so with its
``Paused`` or ``Suspended`` condition, so nothing that keys on the phase has to
learn a new one.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field
from pydantic.config import JsonDict

from sandlot.api.common import (
    AGE_COLUMN,
    DNS_SUBDOMAIN,
    MAX_ARG,
    MAX_ARGS,
    MAX_CAPABILITIES,
    MAX_ENV,
    MAX_IMAGE,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_PORTS,
    MAX_QUANTITY,
    MAX_WORD,
    SANDBOXES,
    Conditions,
    CrdInfo,
    Model,
    PortNumber,
    PrinterColumn,
    Resource,
    cel_list,
)
from sandlot.api.envvars import MAX_ENV_FROM, EnvFromSource, EnvVar
from sandlot.api.netpolicy import SandboxNetworkPolicy
from sandlot.api.placement import Affinity, NodeLabels, Tolerations
from sandlot.api.probe import Probe
from sandlot.api.reasons import ConditionType


class ShutdownPolicy(StrEnum):
    """What happens to a sandbox at its ``shutdownTime`` or deadline (agent-sandbox's names)."""

    RETAIN = "Retain"
    """Kept, ended Stopped with reason DeadlineExceeded (the default)."""
    DELETE = "Delete"
    """Deleted: its agent stops the container as for any deleted sandbox."""


class OperatingMode(StrEnum):
    """What the sandbox's process should be doing (``spec.operatingMode``)."""

    RUNNING = "Running"
    PAUSED = "Paused"
    """Frozen by the cgroup freezer: memory and processes kept, no CPU."""
    SUSPENDED = "Suspended"
    """Its filesystem committed to an image on its node, its container removed."""


class IdleAction(StrEnum):
    """What ``spec.idleTimeoutSeconds`` does to an idle sandbox (``spec.idleAction``)."""

    PAUSE = "Pause"
    """Processes frozen, memory kept: back in milliseconds."""
    SUSPEND = "Suspend"
    """Filesystem committed, container removed: nothing held; back from its files."""


class SandboxPhase(StrEnum):
    PENDING = "Pending"
    SCHEDULED = "Scheduled"
    RUNNING = "Running"
    STOPPED = "Stopped"
    FAILED = "Failed"
    DEAD = "Dead"


TERMINAL_PHASES: frozenset[str] = frozenset(
    {SandboxPhase.STOPPED, SandboxPhase.FAILED, SandboxPhase.DEAD}
)
# Phases in which a sandbox holds (or is about to hold) a container on its node.
ACTIVE_PHASES: frozenset[str] = frozenset({SandboxPhase.SCHEDULED, SandboxPhase.RUNNING})

_TERMINAL = [p for p in SandboxPhase if p in TERMINAL_PHASES]
# Secrets a sandbox may name for its image's registry (as many as a Pod has in practice).
MAX_PULL_SECRETS = 16
# A non-negative Kubernetes quantity, the grammar sandlot.policy.quantity parses:
# a decimal number, then a binary or decimal suffix or a decimal exponent.
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?$"
# The smallest limits a sandbox may ask for. Below them a limit is not one: runc
# reads a memory limit of 0 as none, and a few KiB cannot even start a process.
MIN_MEMORY_LIMIT = "4Mi"
MIN_CPU_LIMIT = "1m"
# A few files and a log already take this much: below it a disk limit stops anything.
MIN_EPHEMERAL_STORAGE_LIMIT = "1Mi"
Arg = Annotated[str, Field(max_length=MAX_ARG)]
Quantity = Annotated[str, Field(max_length=MAX_QUANTITY, pattern=QUANTITY_PATTERN)]
"""A Kubernetes quantity (``256Mi``, ``500m``, ``1Gi``) as QUANTITY_PATTERN admits it."""
CapabilityName = Annotated[str, Field(max_length=64)]


class LocalObjectReference(Model):
    name: str = Field(
        min_length=1, max_length=MAX_NAME, description="Name of an object in the same namespace."
    )


class ImagePullProgress(Model):
    bytes: int = Field(default=0, ge=0, description="Bytes of the image on the node so far.")
    total_bytes: int = Field(default=0, ge=0, description="Bytes of the image's config and layers.")


class SuspendedState(Model):
    image: str = Field(
        max_length=512,
        description="Where the suspended filesystem was pushed: `registry/repository:tag@digest`.",
    )
    digest: str = Field(max_length=80, description="The pushed manifest's digest.")
    node: str = Field(max_length=MAX_NAME, description="The node that committed and pushed it.")


class SandboxPort(Model):
    name: str | None = Field(
        default=None,
        max_length=15,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Port name, used as the EndpointSlice port name (IANA service name rules).",
    )
    container_port: PortNumber = Field(description="Port the sandbox listens on.")
    protocol: Literal["TCP", "UDP"] = Field(default="TCP", description="TCP or UDP.")


COMMITTED_IMAGE_REPOSITORIES = ("sandlot.local/snapshots/", "sandlot.local/suspended/")
"""Where sandlot commits snapshots and suspended sandboxes on a node: never a
``spec.image`` (``sandlot.policy.committed``)."""


def _not_committed() -> JsonDict:
    """CEL refusing an image name sandlot commits into (any case of the host)."""
    starts = " || ".join(
        f"self.lowerAscii().startsWith('{p}')" for p in COMMITTED_IMAGE_REPOSITORIES
    )
    names = ", ".join(f"{p}..." for p in COMMITTED_IMAGE_REPOSITORIES)
    return {
        "x-kubernetes-validations": [
            {
                "rule": f"!({starts})",
                "message": f"may not name an image sandlot committed ({names}): fork a "
                "snapshot with spec.snapshotRef",
                "reason": "FieldValueForbidden",
            }
        ]
    }


def _at_least(floor: str, what: str) -> JsonDict:
    """CEL refusing a quantity below ``floor`` (``isQuantity`` first: the pattern
    speaks for text that is not one)."""
    return {
        "x-kubernetes-validations": [
            {
                "rule": f"!isQuantity(self) || quantity(self).compareTo(quantity('{floor}')) >= 0",
                "message": f"{what} must be at least {floor}",
                "reason": "FieldValueInvalid",
            }
        ]
    }


class ResourceLimits(Model):
    memory: Quantity | None = Field(
        default=None,
        json_schema_extra=_at_least(MIN_MEMORY_LIMIT, "a memory limit"),
        description="Memory limit as a Kubernetes quantity (`256Mi`, `1Gi`); a process "
        f"over it is killed by the kernel's OOM killer. At least {MIN_MEMORY_LIMIT}: "
        "runc would read 0 as no limit at all.",
    )
    cpu: Quantity | None = Field(
        default=None,
        json_schema_extra=_at_least(MIN_CPU_LIMIT, "a CPU limit"),
        description="CPU limit as a Kubernetes quantity (`500m`, `2`), enforced as a CFS "
        f"quota. At least {MIN_CPU_LIMIT}.",
    )
    ephemeral_storage: Quantity | None = Field(
        default=None,
        json_schema_extra=_at_least(MIN_EPHEMERAL_STORAGE_LIMIT, "an ephemeral storage limit"),
        description="Disk limit as a Kubernetes quantity (`1Gi`): the allocated blocks of the "
        "sandbox's writable layer and log files, measured as the kubelet does by its node's "
        "agent every agent.logInterval (10s); over it the sandbox is killed and ends Failed, "
        "reason EphemeralStorageExceeded. At least "
        f"{MIN_EPHEMERAL_STORAGE_LIMIT}; unset (and no namespace default): not measured.",
    )


class SandboxResources(Model):
    limits: ResourceLimits = Field(
        default_factory=ResourceLimits,
        description="Hard limits: memory and CPU held by the kernel, disk by the agent.",
    )


class Capabilities(Model):
    add: list[CapabilityName] = Field(
        default_factory=list,
        max_length=MAX_CAPABILITIES,
        description="Linux capabilities added to the sandbox's baseline set (CHOWN, "
        "DAC_OVERRIDE, FOWNER, FSETID, KILL, SETGID, SETUID, NET_BIND_SERVICE, SYS_CHROOT). "
        "Names with or without `CAP_`, any case (`NET_ADMIN`, `cap_net_raw`); `ALL` means "
        "every capability. A `baseline` namespace may add AUDIT_WRITE, CHOWN, "
        "DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, SETFCAP, SETGID, "
        "SETPCAP, SETUID, SYS_CHROOT; a `restricted` one only NET_BIND_SERVICE; others "
        "need the label `sandlot.dev/enforce=privileged`. They take effect for UID 0 "
        "only (there are no ambient capabilities). The seccomp profile still applies.",
    )


class SecurityContext(Model):
    run_as_user: int | None = Field(
        default=None,
        ge=0,
        description="UID the sandbox's process runs as (default: the image's numeric "
        "user, else 0). A non-zero UID has no effective capabilities.",
    )
    run_as_group: int | None = Field(
        default=None,
        ge=0,
        description="GID the process runs as (default: the image's numeric group, else 0).",
    )
    run_as_non_root: bool | None = Field(
        default=None,
        description="When true, the agent refuses to start a process that would run as UID "
        "0 (from runAsUser or the image): the sandbox ends Failed, reason "
        "RunAsRootRefused. Required by the `restricted` level.",
    )
    read_only_root_filesystem: bool | None = Field(
        default=None,
        description="Mount the sandbox's root filesystem read-only; /dev/shm and /run stay "
        "writable tmpfs.",
    )
    capabilities: Capabilities | None = Field(
        default=None, description="Capabilities beyond the baseline."
    )
    privileged: bool | None = Field(
        default=None,
        description="Run with every capability the node has, no seccomp filter, no masked "
        "/proc paths and a writable /sys: the sandbox then owns the node. Refused unless "
        "the namespace is labelled `sandlot.dev/enforce=privileged`.",
    )


class SandboxSpec(Model):
    image: str = Field(
        min_length=1,
        max_length=MAX_IMAGE,
        description="Image reference (for example `docker.io/library/busybox:1.36`); "
        "the node's agent pulls it as imagePullPolicy says. Never one sandlot committed "
        "(`sandlot.local/snapshots/`, `sandlot.local/suspended/`): a fork names its "
        "snapshot in snapshotRef.",
        json_schema_extra=_not_committed(),
    )
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = Field(
        default="IfNotPresent",
        description="When the agent pulls the image, with the kubelet's meaning: "
        "`IfNotPresent` only when the node lacks it, `Always` resolves the reference "
        "again at every start (a moved tag is pulled), `Never` uses only what the node has.",
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        max_length=MAX_PULL_SECRETS,
        description="Secrets of type kubernetes.io/dockerconfigjson in the sandbox's "
        "namespace with credentials for its image's registry. The operator hands them "
        "to the agent of the sandbox's node only (docs/isolation.md).",
    )
    command: list[Arg] = Field(
        max_length=MAX_ARGS,
        default_factory=list,
        description="Argv of the sandbox's process; empty means the image's entrypoint and cmd.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Environment variables, as a container's: a value, or `valueFrom` a "
        "key of a Secret or ConfigMap in the sandbox's namespace. A missing object or key "
        "(not `optional`) keeps the sandbox Scheduled with reason "
        "CreateContainerConfigError until it appears.",
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=MAX_ENV_FROM,
        description="Every key of a Secret or ConfigMap as a variable (as a container's "
        "envFrom); `env` is applied after, and wins.",
    )
    ports: list[SandboxPort] = Field(
        default_factory=list,
        max_length=MAX_PORTS,
        description="Ports the sandbox serves, published to its pool's Service.",
    )
    readiness_probe: Probe | None = Field(
        default=None,
        description="How its node's agent tells whether the Running sandbox serves (as a "
        "Pod's readinessProbe); the result is its `Ready` condition. Only a Ready "
        "sandbox is a ready endpoint of its pool's Service, is claimed, and counts as "
        "available in a rollout. Without a probe it is ready once Running (no "
        "condition); a paused sandbox is not probed.",
    )
    node_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN,
        description="The SandboxNode this sandbox runs on. Set by the scheduler when "
        "empty; immutable once set. Selectable: `--field-selector spec.nodeName=N`.",
    )
    runtime_class_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME,
        pattern=DNS_SUBDOMAIN,
        description="The RuntimeClass (node.k8s.io/v1) whose handler runs this sandbox, as "
        "a Pod's: it goes only to a SandboxNode whose status.runtimeHandlers has the "
        "handler, with the class's scheduling.nodeSelector and tolerations added to its "
        "own, and the class's overhead.podFixed counted in the node's capacity. Empty: the "
        "node's default handler (runc). A missing class, a class sandlot cannot honour or "
        "a handler the node lacks ends the sandbox Failed (RuntimeClassNotFound, "
        "InvalidRuntimeClass, RuntimeHandlerUnknown).",
    )
    host_network: bool = Field(
        default=False,
        description="Share the node's network namespace instead of getting an own one "
        "(the sandbox can then reach every service on the node's loopback). Refused unless "
        "the namespace is labelled `sandlot.dev/enforce=privileged`.",
    )
    network_policy: SandboxNetworkPolicy | None = Field(
        default=None,
        description="Traffic the sandbox accepts and sends, shaped like a NetworkPolicy's "
        "ingress and egress and enforced by its node's agent before its process starts. "
        "Unset parts take the namespace's sandlot.dev/default-network-policy, then the "
        "cluster default: no link-local (metadata), node, cluster or RFC 1918 "
        "destinations; connections in only from the node and to the published ports "
        "(docs/isolation.md).",
    )
    resources: SandboxResources | None = Field(default=None, description="Resource limits.")
    security_context: SecurityContext | None = Field(
        default=None,
        description="Security settings, modelled on the Pod's. Without them a sandbox gets "
        "the safe defaults: own namespaces, the capability baseline, no new privileges, "
        "the seccomp profile, masked kernel paths and a pids limit (docs/isolation.md).",
    )
    tolerations: Tolerations = Field(
        default_factory=list,
        description="Taints of SandboxNodes this sandbox tolerates (as a Pod's).",
    )
    node_selector: NodeLabels = Field(
        default_factory=dict,
        description="Labels the SandboxNode must have (as a Pod's nodeSelector).",
    )
    affinity: Affinity | None = Field(
        default=None,
        description="Required node affinity over the SandboxNodes' labels (as a Pod's).",
    )
    host_users: bool | None = Field(
        default=None,
        description="false asks for a user namespace: root in the sandbox is an "
        "unprivileged user on the node, from a range of 65536 host IDs of its own, and "
        "its root filesystem is a copy of the image owned by that range. A node whose "
        "kernel allows no user namespaces ends the sandbox Failed "
        "(UserNamespacesUnsupported) rather than run it with the node's users.",
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description="Seconds between SIGTERM and SIGKILL when the sandbox is stopped "
        "(default: the agent's stop grace).",
    )
    shutdown_time: AwareDatetime | None = Field(
        default=None,
        description="When the sandbox ends (RFC 3339, for example `2030-01-02T15:04:05Z`): "
        "at that second, on the operator's clock, it becomes Stopped with reason "
        "DeadlineExceeded and its container is stopped.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds the sandbox may live, counted from its creation; then it ends "
        "as with shutdownTime. With both set, the earlier wins.",
    )
    shutdown_policy: ShutdownPolicy = Field(
        default=ShutdownPolicy.RETAIN,
        description="What happens at shutdownTime or activeDeadlineSeconds: `Retain` (the "
        "default) ends the sandbox Stopped with reason DeadlineExceeded and keeps the "
        "object; `Delete` deletes it.",
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        description="Seconds a finished sandbox (Stopped, Failed or Dead) is "
        "kept, counted from status.finishedAt on the operator's clock; then it is "
        "deleted. A pool keeps the failed members its crash back-off counts.",
    )
    snapshot_ref: LocalObjectReference | None = Field(
        default=None,
        description='A SandboxSnapshot (same namespace) to start from ("fork"): the '
        "sandbox is placed on the snapshot's node once it is Ready and its container "
        "starts from the snapshot's image (status.imageRef) instead of `image`, which "
        "stays the base it was taken over. The snapshot is kept while any sandbox names "
        "it. Immutable.",
    )
    operating_mode: OperatingMode = Field(
        default=OperatingMode.RUNNING,
        description="`Running` (the default), `Paused` or `Suspended`. `Paused`: the "
        "sandbox's processes frozen by the cgroup freezer, their memory kept (and counted "
        "in the node's capacity), no CPU used; `Running` again resumes them where they "
        "were, same process; its `Paused` condition says when it was frozen. `Suspended`: "
        "its writable filesystem committed to an image on its node, its container and "
        "processes removed (memory and CPU freed, nothing counted in the node's "
        "capacity); `Running` again starts a new container from that image on the same "
        "node, with the files written before (not the processes or memory; the address "
        "may change); its `Suspended` condition says so. Either way the sandbox stays "
        "phase Running on its node with its claim. Exec, files and port-forward are "
        "refused (409) while it is Suspended, and while it is Paused unless the node's "
        "agent is set to thaw a paused sandbox for them (paused_streams: Resume).",
    )
    idle_timeout_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds without use after which the node's agent pauses the sandbox "
        "on its own (off when unset): no exec, files or port-forward session open and its "
        "CPU below the agent's idle threshold for that long. The spec keeps asking for "
        "Running; the `Paused` condition says True with reason `Idle`, and the next exec, "
        "files call or port-forward resumes it before it is served. Each transition is an "
        "Event (`IdlePaused`, `ResumedOnUse`).",
    )
    idle_action: IdleAction | None = Field(
        default=None,
        description="What the idle timeout does: `Pause` (the default: processes frozen, "
        "memory kept) or `Suspend` (filesystem committed and container removed, no memory "
        "held: the `Suspended` condition says True with reason `Idle`; the next exec, files "
        "call, port-forward or claim starts it again from its files, its processes new). "
        "Events `IdleSuspended`, `ResumedOnUse`.",
    )


class SandboxStatus(Model):
    phase: SandboxPhase = Field(
        default=SandboxPhase.PENDING,
        description="Pending, Scheduled, Running, Stopped, Failed or Dead. The last three "
        "are terminal: the API server refuses a change out of them.",
    )
    reason: str | None = Field(
        default=None,
        max_length=MAX_WORD,
        description="One CamelCase word for the last phase change (NodeLost, Exited, ...).",
    )
    message: str | None = Field(
        default=None, max_length=MAX_MESSAGE, description="Human-readable detail."
    )
    container_id: str | None = Field(
        default=None, max_length=MAX_NAME, description="containerd container id."
    )
    pid: int | None = Field(default=None, description="Host PID of the sandbox's process.")
    ip: str | None = Field(
        default=None, max_length=64, description="Address the sandbox is reachable at."
    )
    started_at: datetime | None = Field(default=None, description="When the process started.")
    finished_at: datetime | None = Field(default=None, description="When it ended.")
    exit_code: int | None = Field(default=None, description="Exit status, once it exited.")
    image_pull: ImagePullProgress | None = Field(
        default=None, description="Progress of the image pull while the reason is Pulling."
    )
    suspended_state: SuspendedState | None = Field(
        default=None,
        description="Set while suspended when the agent's suspend_state_repository is "
        "set: the committed filesystem pushed there, so any node may start it again.",
    )
    conditions: Conditions = Field(default_factory=list, description="Conditions.")


class Sandbox(Resource):
    crd = CrdInfo(
        kind="Sandbox",
        plural=SANDBOXES,
        scope="Namespaced",
        short_names=("sb",),
        columns=(
            PrinterColumn("Phase", ".status.phase"),
            PrinterColumn("Node", ".spec.nodeName"),
            PrinterColumn("IP", ".status.ip"),
            AGE_COLUMN,
            PrinterColumn("Pool", ".metadata.labels.sandlot\\.dev/pool", priority=1),
            PrinterColumn("Mode", ".spec.operatingMode", priority=1),
            # Empty without a readinessProbe: such a sandbox is ready once Running.
            PrinterColumn(
                ConditionType.READY.value,
                f'.status.conditions[?(@.type=="{ConditionType.READY}")].status',
                priority=1,
            ),
            PrinterColumn("Reason", ".status.reason", priority=1),
            PrinterColumn("Shutdown-Time", ".spec.shutdownTime", priority=1),
            PrinterColumn("Active-Deadline", ".spec.activeDeadlineSeconds", "integer", priority=1),
        ),
        selectable_fields=(".spec.nodeName",),
        validations={
            # A sandbox whose suspended state was pushed may be bound to another node
            # (a move); a main-resource write cannot change the status the rule reads.
            "": [
                {
                    "rule": "!has(oldSelf.spec.nodeName) || (has(self.spec.nodeName) && "
                    "(self.spec.nodeName == oldSelf.spec.nodeName || (has(oldSelf.status) "
                    "&& has(oldSelf.status.suspendedState))))",
                    "message": "spec.nodeName is immutable once set (but for a move of a "
                    "sandbox whose suspended state was pushed)",
                    "reason": "FieldValueForbidden",
                    "fieldPath": ".spec.nodeName",
                }
            ],
            "spec": [
                {
                    "rule": "has(self.snapshotRef) == has(oldSelf.snapshotRef) && "
                    "(!has(self.snapshotRef) || self.snapshotRef == oldSelf.snapshotRef)",
                    "message": "spec.snapshotRef is immutable",
                    "reason": "FieldValueForbidden",
                },
            ],
            "status": [
                {
                    "rule": f"!has(oldSelf.phase) || !(oldSelf.phase in {cel_list(_TERMINAL)}) "
                    "|| (has(self.phase) && self.phase == oldSelf.phase)",
                    "message": f"status.phase is terminal: a {', '.join(_TERMINAL[:-1])} or "
                    f"{_TERMINAL[-1]} sandbox cannot move to another phase",
                    "reason": "FieldValueForbidden",
                }
            ],
        },
    )

    kind: str = "Sandbox"
    spec: SandboxSpec
    status: SandboxStatus | None = None
