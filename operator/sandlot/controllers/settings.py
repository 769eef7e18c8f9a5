"""The operator's settings: one model, validated at start; flags and environment
variables are derived from it (``sandlot.cli.options``)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, model_validator

from sandlot.api.settings import Duration, SettingsModel


class OperatorSettings(SettingsModel):
    namespace: str = Field(
        default="sandlot-system",
        min_length=1,
        description="Namespace of the agents' node Leases and the leader-election Lease.",
    )
    grace_period: Duration = Field(
        default=timedelta(seconds=300),
        description="How long a NotReady node's sandboxes are left alone, counted from its "
        "lease's expiry, before they are marked Dead. Longer protects slow agent restarts; "
        "shorter moves traffic off a dead node sooner.",
    )
    drain_timeout: Duration = Field(
        default=timedelta(minutes=10),
        description="How long a drained (Disabled) node's lease may stay expired before its "
        "remaining sandboxes are marked Dead with reason DrainAbandoned.",
    )
    disruption_threshold: float = Field(
        default=0.55,
        gt=0.0,
        le=1.0,
        description="Fraction of not-Disabled nodes NotReady at once at which the "
        "mass-failure guard holds all Dead marking.",
    )
    min_nodes_for_guard: int = Field(
        default=3, ge=1, description="Fewest not-Disabled nodes for which the guard applies."
    )
    guard_window: Duration = Field(
        default=timedelta(minutes=10),
        description="Nodes handled (sandboxes marked Dead) longer ago than this are left out "
        "of both sides of the mass-failure guard's fraction: the past, not the present outage.",
    )
    agent_lease_duration: Duration = Field(
        default=timedelta(seconds=60),
        description="How long a SandboxNode whose Lease the operator never saw counts as "
        "Ready after the operator first saw it; set it to the agents' lease duration.",
    )
    lease_view_max_age: Duration = Field(
        default=timedelta(seconds=45),
        description="No view of the agents' Leases older than this is used to mark "
        "sandboxes Dead: a lease watch that died silently is noticed and replaced within "
        "it. Must stay well below the agents' lease duration plus the grace period.",
    )
    resync_interval: Duration = Field(
        default=timedelta(seconds=30),
        description="Timer interval re-evaluating every node; deadlines are also met exactly.",
    )
    env_reference_retry_interval: Duration = Field(
        default=timedelta(seconds=5),
        description="How often a node is re-brokered while one of its sandboxes waits "
        "for a Secret or ConfigMap its environment references (CreateContainerConfigError): "
        "an object or key created meanwhile reaches the node within it.",
    )
    mark_concurrency: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Concurrent status writes when marking sandboxes Dead, shared by every "
        "node marked at once; also the most nodes whose passes run at once.",
    )
    pool_max_replicas: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Most members one SandboxPool keeps: a pool asking more keeps this many, "
        "says so in status.cappedAt and a ReplicasCapped Warning Event.",
    )
    metrics_port: int = Field(
        default=8080, ge=0, le=65535, description="Port of /metrics, /livez and /readyz (0 = off)."
    )
    leader_election: bool = Field(
        default=True, description="Elect one active replica through a Lease; standbys wait."
    )
    leader_lease_name: str = Field(
        default="sandlot-operator", min_length=1, description="Name of the leader-election Lease."
    )
    leader_lease_duration: Duration = Field(
        default=timedelta(seconds=12),
        description="Leader-election lease duration; a standby takes over at most this long "
        "(plus one retry period) after the active replica dies without releasing it.",
    )
    leader_renew_deadline: Duration = Field(
        default=timedelta(seconds=8),
        description="The active replica steps down when it could not renew for this long.",
    )
    leader_retry_period: Duration = Field(
        default=timedelta(seconds=2), description="How often replicas try to acquire or renew."
    )
    identity: str = Field(
        default="",
        description="This replica's identity in the Lease (default: host name + pid). The "
        "chart sets it to the pod's name: the leader fence admits writes only from the pod "
        "whose name the Lease holds.",
    )

    @model_validator(mode="after")
    def _check_durations(self) -> OperatorSettings:
        for name in (
            "grace_period",
            "drain_timeout",
            "resync_interval",
            "leader_retry_period",
            "guard_window",
            "agent_lease_duration",
            "lease_view_max_age",
        ):
            if getattr(self, name) <= timedelta(0):
                raise ValueError(f"{name} must be positive")
        if self.lease_view_max_age < timedelta(seconds=2):
            raise ValueError("lease_view_max_age must be at least 2s")
        if self.lease_view_max_age >= self.grace_period + self.agent_lease_duration:
            raise ValueError(
                "lease_view_max_age must be below grace_period + agent_lease_duration: "
                "a view that old could reap a node whose renewals it never saw"
            )
        if not (self.leader_retry_period < self.leader_renew_deadline < self.leader_lease_duration):
            raise ValueError(
                "leader_retry_period < leader_renew_deadline < leader_lease_duration must hold"
            )
        return self
