"""agent-sandbox's objects, served by sandlot: one model inside, two faces.

kubernetes-sigs/agent-sandbox's programs speak ``extensions.agents.x-k8s.io/v1beta1``
``SandboxTemplate``, ``SandboxWarmPool`` and ``SandboxClaim``, and read
``agents.x-k8s.io/v1beta1`` ``Sandbox``. sandlot serves these kinds over its own:
a warm pool is a sandlot ``SandboxPool`` of the same name (its template's one
container translated, ``sandlot.policy.agentsandbox``), a claim a sandlot
``SandboxClaim`` of the same name, and the ``Sandbox`` a mirror of the sandlot
sandbox the claim was bound to, for the client to read its Ready condition and
address. The fields are agent-sandbox's; what sandlot cannot honour is refused on
the claim, naming the field. The podTemplate is kept whole (the schema of a Pod is
Kubernetes'); the translation reads it.

These CRDs are installed only when asked (the chart's ``agentSandbox.enabled``):
they belong to another project's API groups.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import AwareDatetime, Field

from sandlot.api.common import (
    AGE_COLUMN,
    MAX_ENV,
    MAX_ENV_VALUE,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_WORD,
    Conditions,
    CrdInfo,
    Model,
    PrinterColumn,
    Resource,
)

AGENTS_GROUP = "agents.x-k8s.io"
EXTENSIONS_GROUP = "extensions.agents.x-k8s.io"
AGENT_SANDBOX_VERSION = "v1beta1"
AGENTS_API_VERSION = f"{AGENTS_GROUP}/{AGENT_SANDBOX_VERSION}"
EXTENSIONS_API_VERSION = f"{EXTENSIONS_GROUP}/{AGENT_SANDBOX_VERSION}"

TEMPLATES = "sandboxtemplates"
WARM_POOLS = "sandboxwarmpools"
COMPAT_CLAIMS = "sandboxclaims"
COMPAT_SANDBOXES = "sandboxes"

CATEGORIES = ("agent-sandbox",)


def face_crd(kind: str, plural: str, group: str, **more: Any) -> CrdInfo:
    """One of agent-sandbox's kinds as sandlot serves it: namespaced, in that
    project's category, at its version, in ``group``."""
    return CrdInfo(
        kind=kind,
        plural=plural,
        scope="Namespaced",
        categories=CATEGORIES,
        group=group,
        version=AGENT_SANDBOX_VERSION,
        **more,
    )


class InjectionPolicy(StrEnum):
    ALLOWED = "Allowed"
    OVERRIDES = "Overrides"
    DISALLOWED = "Disallowed"


class ClaimShutdownPolicy(StrEnum):
    DELETE = "Delete"
    DELETE_FOREGROUND = "DeleteForeground"
    RETAIN = "Retain"


class PodTemplate(Model):
    metadata: dict[str, Any] = Field(
        default_factory=dict, description="Labels and annotations of each sandbox."
    )
    spec: dict[str, Any] = Field(
        default_factory=dict,
        description="A Pod spec with one container: sandlot runs that container "
        "(docs/agent-sandbox.md lists what maps and what is refused).",
    )


class SandboxTemplateSpec(Model):
    pod_template: PodTemplate = Field(description="What each sandbox runs.")
    volume_claim_templates: list[dict[str, Any]] = Field(
        default_factory=list, max_length=16, description="Refused: sandlot has no volumes yet."
    )
    network_policy: dict[str, Any] | None = Field(
        default=None, description="Refused unless empty: use a sandlot networkPolicy."
    )
    network_policy_management: str = Field(
        default="Managed", max_length=MAX_WORD, description="Managed or Unmanaged."
    )
    env_vars_injection_policy: InjectionPolicy = Field(
        default=InjectionPolicy.DISALLOWED,
        description="Whether a claim may add (Allowed) or also override (Overrides) "
        "environment variables; Disallowed refuses a claim that names any.",
    )
    volume_claim_templates_policy: InjectionPolicy = Field(
        default=InjectionPolicy.DISALLOWED, description="Claims' volumes: refused by sandlot."
    )


class SandboxTemplate(Resource):
    crd = face_crd(
        kind="SandboxTemplate",
        plural=TEMPLATES,
        short_names=("sandboxtemplate",),
        group=EXTENSIONS_GROUP,
    )

    api_version: str = Field(default=EXTENSIONS_API_VERSION, alias="apiVersion")
    kind: str = "SandboxTemplate"
    spec: SandboxTemplateSpec
    status: dict[str, Any] | None = None


class NameRef(Model):
    name: str = Field(min_length=1, max_length=MAX_NAME, description="Name of the object.")


class WarmPoolUpdateStrategy(Model):
    type: str = Field(
        default="OnReplenish",
        max_length=MAX_WORD,
        description="OnReplenish or Recreate: sandlot rolls members to a changed "
        "template with its pool's rolling update either way.",
    )


class SandboxWarmPoolSpec(Model):
    replicas: int = Field(default=1, ge=0, description="Sandboxes kept warm.")
    sandbox_template_ref: NameRef = Field(description="The SandboxTemplate of each sandbox.")
    update_strategy: WarmPoolUpdateStrategy | None = Field(
        default=None, description="How members follow a template change."
    )


class SandboxWarmPoolStatus(Model):
    replicas: int = Field(default=0, description="Sandboxes in the pool.")
    ready_replicas: int = Field(default=0, description="Sandboxes in the pool ready to claim.")
    selector: str = Field(
        default="", max_length=MAX_MESSAGE, description="Label selector of the members."
    )
    conditions: Conditions = Field(
        default_factory=list,
        description="Ready: the sandlot pool serving it exists and takes its template.",
    )


class SandboxWarmPool(Resource):
    crd = face_crd(
        kind="SandboxWarmPool",
        plural=WARM_POOLS,
        short_names=("swp",),
        columns=(
            PrinterColumn("Ready", ".status.readyReplicas", "integer"),
            AGE_COLUMN,
        ),
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
        group=EXTENSIONS_GROUP,
    )

    api_version: str = Field(default=EXTENSIONS_API_VERSION, alias="apiVersion")
    kind: str = "SandboxWarmPool"
    spec: SandboxWarmPoolSpec
    status: SandboxWarmPoolStatus | None = None


class ClaimLifecycle(Model):
    shutdown_time: AwareDatetime | None = Field(
        default=None, description="When the claim expires (RFC 3339)."
    )
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, description="Seconds an expired claim is kept."
    )
    shutdown_policy: ClaimShutdownPolicy = Field(
        default=ClaimShutdownPolicy.RETAIN,
        description="At shutdownTime: Delete (or DeleteForeground) deletes the claim and "
        "its sandbox; Retain stops the sandbox and keeps the claim (ClaimExpired).",
    )


class ClaimEnvVar(Model):
    name: str = Field(min_length=1, max_length=MAX_WORD, description="Variable name.")
    value: str = Field(default="", max_length=MAX_ENV_VALUE, description="Its value.")
    container_name: str | None = Field(
        default=None, max_length=MAX_NAME, description="The template's one container."
    )


class PodMetadata(Model):
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class SandboxClaimSpec(Model):
    warm_pool_ref: NameRef = Field(description="The SandboxWarmPool to take a sandbox from.")
    lifecycle: ClaimLifecycle | None = Field(default=None, description="When the claim ends.")
    additional_pod_metadata: PodMetadata | None = Field(
        default=None, description="Labels and annotations added to the claimed sandbox."
    )
    safe_to_evict: str | None = Field(
        default=None, max_length=MAX_WORD, description="Cluster autoscaler's word; unused."
    )
    env: list[ClaimEnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Environment of every command run through the claim (the warm "
        "sandbox is kept: no cold start), as the template's envVarsInjectionPolicy allows.",
    )
    volume_claim_templates: list[dict[str, Any]] = Field(
        default_factory=list, max_length=16, description="Refused: sandlot has no volumes yet."
    )


class ClaimedSandbox(Model):
    name: str = Field(default="", max_length=MAX_NAME, description="The claimed Sandbox.")
    pod_i_ps: list[str] = Field(
        default_factory=list, alias="podIPs", max_length=2, description="Its addresses."
    )


class SandboxClaimStatus(Model):
    conditions: Conditions = Field(default_factory=list, description="Ready, with its reason.")
    sandbox: ClaimedSandbox | None = Field(default=None, description="The claimed sandbox.")


class SandboxClaim(Resource):
    crd = face_crd(
        kind="SandboxClaim",
        plural=COMPAT_CLAIMS,
        short_names=("sandboxclaim",),
        columns=(
            PrinterColumn("Sandbox", ".status.sandbox.name"),
            PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            PrinterColumn("Reason", '.status.conditions[?(@.type=="Ready")].reason'),
            AGE_COLUMN,
        ),
        group=EXTENSIONS_GROUP,
    )

    api_version: str = Field(default=EXTENSIONS_API_VERSION, alias="apiVersion")
    kind: str = "SandboxClaim"
    spec: SandboxClaimSpec
    status: SandboxClaimStatus | None = None


class MirrorSpec(Model):
    replicas: int = Field(default=1, ge=0, le=1, description="1: the sandbox runs.")
    pod_template: PodTemplate | None = Field(default=None, description="Unused by sandlot.")


class MirrorStatus(Model):
    conditions: Conditions = Field(default_factory=list, description="Ready.")
    pod_i_ps: list[str] = Field(
        default_factory=list, alias="podIPs", max_length=2, description="Its addresses."
    )
    node_name: str | None = Field(default=None, max_length=MAX_NAME, description="Its node.")
    replicas: int = Field(default=0, description="1 while it runs.")
    selector: str = Field(default="", max_length=MAX_MESSAGE, description="Its label selector.")
    finished_at: datetime | None = Field(default=None, description="Unused.")


class Sandbox(Resource):
    crd = face_crd(
        kind="Sandbox",
        plural=COMPAT_SANDBOXES,
        columns=(
            PrinterColumn("Ready", '.status.conditions[?(@.type=="Ready")].status'),
            AGE_COLUMN,
        ),
        group=AGENTS_GROUP,
    )

    api_version: str = Field(default=AGENTS_API_VERSION, alias="apiVersion")
    kind: str = "Sandbox"
    spec: MirrorSpec = Field(default_factory=MirrorSpec)
    status: MirrorStatus | None = None


AGENT_SANDBOX_KINDS: tuple[type[Resource], ...] = (
    SandboxTemplate,
    SandboxWarmPool,
    SandboxClaim,
    Sandbox,
)
