"""The operator's settings: one model, validated at start; flags and environment
variables are derived from it (``sandlot.cli.options``). Node health's and the
guard's settings are their policies' own models, nested (``FLAT`` keeps their
flat flag names: ``--grace-period``, ``SANDLOT_GUARD_WINDOW``)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import ClassVar

from pydantic import Field, model_validator

from sandlot.api.settings import Duration, ListenPort, PemPath, SettingsModel, require_positive
from sandlot.policy.disruption import GuardSettings
from sandlot.policy.nodehealth import NodeHealthSettings


class OperatorSettings(SettingsModel):
    # The policies' own models, their fields under the operator's flat names.
    FLAT: ClassVar[Mapping[str, tuple[str, str]]] = {
        "grace_period": ("node_health", "grace_period"),
        "drain_timeout": ("node_health", "drain_timeout"),
        "agent_lease_duration": ("node_health", "unseen_lease_duration"),
        "disruption_threshold": ("guard", "disruption_threshold"),
        "min_nodes_for_guard": ("guard", "min_nodes"),
        "guard_window": ("guard", "window"),
    }

    namespace: str = Field(
        default="sandlot-system",
        min_length=1,
        description="Namespace of the agents' node Leases and the leader-election Lease.",
    )
    node_health: NodeHealthSettings = Field(
        default_factory=NodeHealthSettings,
        description="When a node's sandboxes are marked Dead (policy.nodehealth).",
    )
    guard: GuardSettings = Field(
        default_factory=GuardSettings,
        description="When the mass-failure guard holds all Dead marking (policy.disruption).",
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
    metrics_port: ListenPort = Field(
        default=8080, description="Port of /metrics, /livez and /readyz (0 = off)."
    )
    agent_sandbox: bool = Field(
        default=False,
        description="Serve kubernetes-sigs/agent-sandbox's SandboxTemplate, SandboxWarmPool, "
        "SandboxClaim and Sandbox (their CRDs installed) over sandlot's pools and claims.",
    )
    state_repository: str = Field(
        default="",
        description="The agents' suspend_state_repository: the operator issues each "
        "sandbox's and snapshot's state key, brokers it to the node that needs it, and "
        "deletes pushed state nothing names any more; empty: no state leaves its node.",
    )
    state_auth_file: str = Field(
        default="",
        description="A .dockerconfigjson file with the credential that deletes from "
        "state_repository (the operator's alone: agents push and pull, never delete); "
        "empty: anonymous.",
    )
    state_registry_private_hosts: list[str] = Field(
        default_factory=list,
        description="State registry hosts (name or name:port) that may resolve to loopback, "
        "link-local or unspecified addresses (repeatable).",
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
    agent_ca_cert: PemPath = Field(
        default="",
        description="PEM file of sandlot's agent CA: the operator signs each agent's "
        "serving certificate with it, for that agent's node only (CertificateSigningRequests "
        "of signer sandlot.dev/agent-serving). Empty: no agent certificate is signed.",
    )
    agent_ca_key: PemPath = Field(
        default="",
        description="PEM file of the agent CA's key; only the operator mounts it.",
    )
    agent_service_account: str = Field(
        default="sandlot-agent",
        min_length=1,
        max_length=253,
        description="ServiceAccount (in namespace) of the agents: only its tokens, bound to "
        "an agent pod on a node, get a certificate, and only for that node.",
    )
    agent_cert_lifetime: Duration = Field(
        default=timedelta(days=7),
        description="Lifetime of an agent's serving certificate; the agent asks for the next "
        "at two thirds of it.",
    )
    identity: str = Field(
        default="",
        description="This replica's identity in the Lease (default: host name + pid). The "
        "chart sets it to the pod's name: the leader fence admits writes only from the pod "
        "whose name the Lease holds.",
    )

    @model_validator(mode="after")
    def _check_durations(self) -> OperatorSettings:
        if bool(self.agent_ca_cert) != bool(self.agent_ca_key):
            raise ValueError("agent_ca_cert and agent_ca_key go together: set both or neither")
        if self.agent_cert_lifetime < timedelta(hours=1):
            raise ValueError("agent_cert_lifetime must be at least 1h")
        require_positive(self, ("resync_interval", "leader_retry_period", "lease_view_max_age"))
        if self.lease_view_max_age < timedelta(seconds=2):
            raise ValueError("lease_view_max_age must be at least 2s")
        health = self.node_health
        if self.lease_view_max_age >= health.grace_period + health.unseen_lease_duration:
            raise ValueError(
                "lease_view_max_age must be below grace_period + agent_lease_duration: "
                "a view that old could reap a node whose renewals it never saw"
            )
        if not (self.leader_retry_period < self.leader_renew_deadline < self.leader_lease_duration):
            raise ValueError(
                "leader_retry_period < leader_renew_deadline < leader_lease_duration must hold"
            )
        return self
