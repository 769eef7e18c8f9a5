"""The words sandlot writes for people and tools to key on: condition types and
reasons, grouped by the object and field they appear in.

Each is a ``StrEnum``: a member equals its string and serialises as it, so what
the API server stores is the word itself. Code names a member, never the word
(``tests/unit/test_vocabulary.py`` holds it to that).
"""

from __future__ import annotations

from enum import StrEnum


class ConditionType(StrEnum):
    """``status.conditions[].type`` on Sandboxes and SandboxNodes."""

    READY = "Ready"
    """Both: whether the object serves now (a sandbox's probe; a node's lease)."""
    SCHEDULED = "Scheduled"
    """Sandbox: whether the scheduler bound it to a node."""
    PAUSED = "Paused"
    """Sandbox: kept by its agent once its operating mode was first applied."""
    SUSPENDED = "Suspended"
    """Sandbox: kept by its agent once it was first suspended."""
    DISK_PRESSURE = "DiskPressure"
    """SandboxNode: its agent's disk is over its high watermark."""
    GUARD_HOLDING = "GuardHolding"
    """SandboxNode: NotReady, its handling held back by the mass-failure guard."""


class SandboxReason(StrEnum):
    """A Sandbox's ``status.reason``, written with its phase."""

    # Scheduled, waiting to start (the kubelet's words where it has one).
    PULLING = "Pulling"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    DISK_PRESSURE = "DiskPressure"
    """Its node does not start it while the node's disk is under pressure."""
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    """A Secret or ConfigMap its environment references is missing."""
    # Running.
    STARTED = "Started"
    # Ended by its process or its agent.
    EXITED = "Exited"
    EXITED_BEFORE_RUNNING = "ExitedBeforeRunning"
    OOM_KILLED = "OOMKilled"
    CONTAINER_LOST = "ContainerLost"
    DRAINED = "Drained"
    EVICTED = "Evicted"
    """Evicted by its node's agent to keep the node's disk under its high watermark."""
    EPHEMERAL_STORAGE_EXCEEDED = "EphemeralStorageExceeded"
    """Its writable layer and logs grew past spec.resources.limits.ephemeralStorage."""
    # Ended by the operator.
    NODE_LOST = "NodeLost"
    NODE_DELETED = "NodeDeleted"
    DRAIN_ABANDONED = "DrainAbandoned"
    MANUAL_REAP = "ManualReap"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    CLAIM_EXPIRED = "ClaimExpired"
    # Refused a start (Failed), or a Scheduled condition's reason for the runtime class.
    POLICY_VIOLATION = "PolicyViolation"
    RUN_AS_ROOT = "RunAsRootRefused"
    INVALID_DEFAULT_LIMITS = "InvalidDefaultLimits"
    LIMIT_REFUSED = "LimitRefused"
    OVER_CAPACITY = "OverCapacity"
    PLACEMENT_REFUSED = "PlacementRefused"
    RUNTIME_HANDLER_UNKNOWN = "RuntimeHandlerUnknown"
    RUNTIME_CLASS_NOT_FOUND = "RuntimeClassNotFound"
    INVALID_RUNTIME_CLASS = "InvalidRuntimeClass"
    APPARMOR_PROFILE_MISSING = "AppArmorProfileMissing"
    USER_NAMESPACES_UNSUPPORTED = "UserNamespacesUnsupported"
    NETWORK_POLICY_FAILED = "NetworkPolicyFailed"
    RESERVED_HOST_PORT = "ReservedHostPort"
    INVALID_NETWORK_POLICY = "InvalidNetworkPolicy"
    NETWORK_SETUP_FAILED = "NetworkSetupFailed"
    ERR_IMAGE_PULL = "ErrImagePull"
    IMAGE_NOT_FOUND = "ImageNotFound"
    """Not on the node (the kubelet says ErrImageNeverPull): under Never, all there is to say."""
    INVALID_IMAGE_NAME = "InvalidImageName"
    IMAGE_UNAVAILABLE = "ImageUnavailable"
    INVALID_SPEC = "InvalidSpec"
    CREATE_FAILED = "CreateFailed"
    START_FAILED = "StartFailed"
    IMAGE_USER_NOT_FOUND = "ImageUserNotFound"
    IMAGE_TOO_LARGE = "ImageTooLarge"


class ScheduledReason(StrEnum):
    """A Sandbox's ``Scheduled`` condition (besides the runtime class's refusals)."""

    BOUND = "Bound"
    UNSCHEDULABLE = "Unschedulable"
    NODE_NOT_FOUND = "NodeNotFound"
    """``spec.nodeName`` names a node that does not exist (yet)."""


class PausedReason(StrEnum):
    """A Sandbox's ``Paused`` condition."""

    PAUSED = "Paused"
    RESUMED = "Resumed"
    PAUSE_FAILED = "PauseFailed"
    RESUME_FAILED = "ResumeFailed"
    IDLE = "Idle"
    """Frozen by its agent after ``spec.idleTimeout`` without use (the spec still
    asks for Running): the next exec, files call or port-forward resumes it."""
    RESUMED_FOR_USE = "ResumedForUse"
    """Thawed for a stream while the spec asks for Paused (the agent's
    ``paused_streams`` is Resume); the sync freezes it again when its streams end."""


class SuspendedReason(StrEnum):
    """A Sandbox's ``Suspended`` condition."""

    SUSPENDED = "Suspended"
    RESTORED = "Restored"
    SUSPEND_FAILED = "SuspendFailed"
    RESTORE_FAILED = "RestoreFailed"
    IDLE = "Idle"
    """Suspended by its agent after ``spec.idleTimeoutSeconds`` without use
    (``spec.idleAction: Suspend``; the spec still asks for Running): the next exec,
    files call, port-forward or claim starts it again from its committed files."""
    RESTORE_PULL_BACK_OFF = "RestorePullBackOff"
    """The pull of its pushed state failed; tried again after a back-off."""
    PUSH_PENDING = "PushPending"
    """Suspended on its node; the push of its state failed for a reason that may pass
    and is tried again after a back-off (a drain does not end it meanwhile)."""
    IDLE_PUSH_PENDING = "IdlePushPending"
    """As ``Idle`` (suspended by its agent for being idle), with its push owed as
    ``PushPending`` says."""


class SnapshotReason(StrEnum):
    """A SandboxSnapshot's ``status.reason`` (with its phase)."""

    TAKING = "Taking"
    TAKEN = "Taken"
    SANDBOX_NOT_FOUND = "SandboxNotFound"
    """Its sandbox does not exist, has ended, or never ran on a node."""
    TAKE_FAILED = "TakeFailed"
    """The node's runtime refused the commit."""
    SNAPSHOT_NOT_READY = "SnapshotNotReady"
    """A Sandbox's Scheduled condition: its spec.snapshotRef is missing, not Ready
    yet, or Failed (the message says which)."""


class ReadyReason(StrEnum):
    """A Sandbox's ``Ready`` condition, kept by its readiness probe (a Dead marking
    writes the Dead reason instead)."""

    PROBE_PASSED = "ProbePassed"
    """True: the probe passed successThreshold times in a row."""
    PROBE_FAILED = "ProbeFailed"
    """False: the probe failed failureThreshold times in a row."""
    NO_PROBE = "NoProbe"
    """True: the probe was removed from a sandbox that had a Ready condition."""


class NodeReason(StrEnum):
    """A SandboxNode's conditions (``Ready``, ``GuardHolding``, ``DiskPressure``)."""

    LEASE_RENEWED = "LeaseRenewed"
    LEASE_EXPIRED = "LeaseExpired"
    DRAINED = "Drained"
    MASS_FAILURE_SUSPECTED = "MassFailureSuspected"
    AGENT_HAS_DISK_PRESSURE = "AgentHasDiskPressure"
    AGENT_HAS_NO_DISK_PRESSURE = "AgentHasNoDiskPressure"


class EventReason(StrEnum):
    """The ``reason`` of the Events the operator (and, for a sandbox's idle pause,
    its node's agent) posts."""

    NODE_NOT_READY = "NodeNotReady"
    NODE_RECOVERED = "NodeRecovered"
    GRACE_EXPIRED = "GraceExpired"
    MANUAL_REAP = "ManualReap"
    MASS_FAILURE_HOLD = "MassFailureHold"
    SANDBOXES_MARKED_DEAD = "SandboxesMarkedDead"
    MARKING_STOPPED = "MarkingStopped"
    MARKING_FAILED = "MarkingFailed"
    REPLICAS_CAPPED = "ReplicasCapped"
    BACK_OFF = "BackOff"
    SERVICE_TAKEN = "ServiceTaken"
    IDLE_PAUSED = "IdlePaused"
    IDLE_SUSPENDED = "IdleSuspended"
    RESUMED_ON_USE = "ResumedOnUse"


class ExecReason(StrEnum):
    """The exec stream's closing Status (Kubernetes' words): a command's exit code."""

    NON_ZERO_EXIT_CODE = "NonZeroExitCode"
    EXIT_CODE = "ExitCode"
    """The cause whose message is the exit code."""


class AgentSandboxReason(StrEnum):
    """The ``Ready`` condition's reason on the agent-sandbox face
    (``extensions.agents.x-k8s.io`` SandboxClaims and SandboxWarmPools,
    ``agents.x-k8s.io`` Sandboxes): agent-sandbox's own words, which its client keys
    on (the first eight are final to it: it stops waiting)."""

    TEMPLATE_NOT_FOUND = "TemplateNotFound"
    WARM_POOL_NOT_FOUND = "WarmPoolNotFound"
    INVALID_METADATA = "InvalidMetadata"
    ENV_VARS_INJECTION_REJECTED = "EnvVarsInjectionRejected"
    VOLUME_CLAIM_TEMPLATES_ERROR = "VolumeClaimTemplatesError"
    CLAIM_EXPIRED = "ClaimExpired"
    INVALID_CONFIGURATION = "InvalidConfiguration"
    POD_FAILED = "PodFailed"
    """Its sandbox ended Failed or Dead, or was deleted: a claim is never bound again."""
    SANDBOX_READY = "SandboxReady"
    SANDBOX_NOT_READY = "SandboxNotReady"
    """Bound, its sandbox not serving now (paused, its probe failing)."""
    WAITING_FOR_SANDBOX = "WaitingForSandbox"
    """No Ready member of the pool yet."""


__all__ = [
    "AgentSandboxReason",
    "ConditionType",
    "EventReason",
    "ExecReason",
    "NodeReason",
    "PausedReason",
    "ReadyReason",
    "SandboxReason",
    "ScheduledReason",
]
