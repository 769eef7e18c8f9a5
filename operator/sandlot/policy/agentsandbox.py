"""agent-sandbox's objects in sandlot's terms: pure translations and decisions.

A SandboxTemplate's podTemplate with one container becomes a sandlot Sandbox spec
(``translate_template``); a field sandlot cannot honour is a ``Refusal`` naming it,
never dropped in silence (a dropped ``capabilities.drop`` would run a sandbox with
more than its author allowed). A SandboxClaim is checked against its template
(``check_claim``: volumes, the environment its template's policy allows, metadata
keys), becomes a sandlot claim (``sandlot_claim_spec``), and its status follows
what the sandlot claim and its sandbox say (``claim_view``), in agent-sandbox's
words, which its client keys on.

Claim-time ``env`` keeps the warm path: the claimed sandbox was started before the
claim, so the environment is given to every command run through the claim, not to
the sandbox's own process (agent-sandbox instead starts a new sandbox cold).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from sandlot.api.agentsandbox import ClaimShutdownPolicy, InjectionPolicy
from sandlot.api.claim import ClaimPhase
from sandlot.api.reasons import AgentSandboxReason as Reason
from sandlot.api.sandbox import SandboxPhase, SandboxSpec, ShutdownPolicy
from sandlot.api.timestamps import parse_time

POD = "spec.podTemplate.spec"
CONTAINER = f"{POD}.containers[0]"

# Pod fields sandlot honours, and ones that change nothing it runs (their defaults
# are what a sandbox does anyway): everything else in a podTemplate is refused.
POD_FIELDS = frozenset(
    {
        "containers",
        "runtimeClassName",
        "terminationGracePeriodSeconds",
        "nodeSelector",
        "tolerations",
        "affinity",
        "securityContext",
        "imagePullSecrets",
        "hostUsers",
    }
)
POD_FIELDS_WITHOUT_EFFECT = frozenset({"restartPolicy", "dnsPolicy", "enableServiceLinks"})
CONTAINER_FIELDS = frozenset(
    {
        "name",
        "image",
        "imagePullPolicy",
        "command",
        "args",
        "env",
        "envFrom",
        "ports",
        "resources",
        "securityContext",
        "readinessProbe",
    }
)
CONTAINER_FIELDS_WITHOUT_EFFECT = frozenset(
    {"terminationMessagePath", "terminationMessagePolicy", "stdin", "tty"}
)
SECURITY_FIELDS = frozenset(
    {
        "runAsUser",
        "runAsGroup",
        "runAsNonRoot",
        "readOnlyRootFilesystem",
        "capabilities",
        "privileged",
    }
)
RESERVED_KEY_PREFIXES = ("sandlot.dev/", "agents.x-k8s.io/", "extensions.agents.x-k8s.io/")


@dataclass(frozen=True)
class Refusal:
    """Why a template or claim cannot be served: the reason agent-sandbox's client
    knows, and a message naming the field."""

    reason: Reason
    message: str


@dataclass(frozen=True)
class Translated:
    """A template as a sandlot pool's template: the members' metadata and spec."""

    spec: dict[str, Any]
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env_names: frozenset[str] = frozenset()
    container_name: str = ""


def _invalid(where: str, why: str) -> Refusal:
    return Refusal(Reason.INVALID_CONFIGURATION, f"{where}: {why}")


def _unknown(fields: Mapping[str, Any], allowed: frozenset[str], ignored: frozenset[str]) -> str:
    return next((k for k in sorted(fields) if k not in allowed | ignored), "")


def _security(pod_sc: Mapping[str, Any], sc: Mapping[str, Any]) -> dict[str, Any] | Refusal:
    """The container's securityContext over the pod's, in sandlot's fields."""
    for where, ctx, allowed in (
        (f"{POD}.securityContext", pod_sc, SECURITY_FIELDS - {"capabilities", "privileged"}),
        (f"{CONTAINER}.securityContext", sc, SECURITY_FIELDS),
    ):
        for key, value in ctx.items():
            if key == "allowPrivilegeEscalation" and value is False:
                continue  # every sandbox runs with noNewPrivileges
            if key == "seccompProfile" and (value or {}).get("type") == "RuntimeDefault":
                continue  # sandlot's own profile is RuntimeDefault's equal
            if key == "fsGroup" or key not in allowed:
                return _invalid(f"{where}.{key}", "sandlot cannot honour it")
    merged = {k: v for k, v in pod_sc.items() if k in SECURITY_FIELDS}
    merged.update({k: v for k, v in sc.items() if k in SECURITY_FIELDS})
    caps = merged.get("capabilities") or {}
    if caps.get("drop"):
        return _invalid(
            f"{CONTAINER}.securityContext.capabilities.drop",
            "sandlot's baseline set is fixed; it cannot drop from it",
        )
    if caps:
        merged["capabilities"] = {"add": list(caps.get("add") or [])}
    return merged


def translate_template(template_spec: Mapping[str, Any]) -> Translated | Refusal:
    """A SandboxTemplate's spec as a sandlot pool template, or why it cannot be one."""
    if template_spec.get("volumeClaimTemplates"):
        return Refusal(
            Reason.VOLUME_CLAIM_TEMPLATES_ERROR,
            "spec.volumeClaimTemplates: sandlot has no volumes yet",
        )
    policy = template_spec.get("networkPolicy")
    if policy and template_spec.get("networkPolicyManagement", "Managed") != "Unmanaged":
        return _invalid("spec.networkPolicy", "use the sandbox's sandlot networkPolicy instead")
    pod_template = template_spec.get("podTemplate") or {}
    pod = pod_template.get("spec") or {}
    if pod.get("volumes"):
        return Refusal(Reason.VOLUME_CLAIM_TEMPLATES_ERROR, f"{POD}.volumes: no volumes yet")
    extra = _unknown(pod, POD_FIELDS, POD_FIELDS_WITHOUT_EFFECT)
    if extra:
        return _invalid(f"{POD}.{extra}", "sandlot cannot honour it")
    containers = pod.get("containers") or []
    if len(containers) != 1:
        return _invalid(f"{POD}.containers", f"exactly one container, not {len(containers)}")
    c = containers[0]
    extra = _unknown(c, CONTAINER_FIELDS, CONTAINER_FIELDS_WITHOUT_EFFECT)
    if extra == "volumeMounts":
        return Refusal(Reason.VOLUME_CLAIM_TEMPLATES_ERROR, f"{CONTAINER}.volumeMounts: no volumes")
    if extra:
        return _invalid(f"{CONTAINER}.{extra}", "sandlot cannot honour it")
    if c.get("args") and not c.get("command"):
        return _invalid(
            f"{CONTAINER}.args", "args without command: sandlot runs a whole command line"
        )
    security = _security(pod.get("securityContext") or {}, c.get("securityContext") or {})
    if isinstance(security, Refusal):
        return security
    for i, port in enumerate(c.get("ports") or []):
        if port.get("hostPort") or port.get("hostIP"):
            return _invalid(f"{CONTAINER}.ports[{i}].hostPort", "sandboxes publish no host port")
    resources = c.get("resources") or {}
    spec: dict[str, Any] = {
        "image": c.get("image") or "",
        "command": [*(c.get("command") or []), *(c.get("args") or [])],
        "env": list(c.get("env") or []),
        "envFrom": list(c.get("envFrom") or []),
        "ports": [
            {k: v for k, v in p.items() if k in ("name", "containerPort", "protocol")}
            for p in c.get("ports") or []
        ],
        "resources": {"limits": _limits(resources.get("limits") or {})},
        "securityContext": security,
    }
    for key in ("imagePullPolicy", "readinessProbe"):
        if key in c:
            spec[key] = c[key]
    for key in (
        "runtimeClassName",
        "terminationGracePeriodSeconds",
        "nodeSelector",
        "tolerations",
        "affinity",
        "imagePullSecrets",
        "hostUsers",
    ):
        if key in pod:
            spec[key] = pod[key]
    try:
        checked = SandboxSpec.model_validate(spec).wire()
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return _invalid(f"{CONTAINER} ({where})", first["msg"])
    metadata = pod_template.get("metadata") or {}
    return Translated(
        checked,
        dict(metadata.get("labels") or {}),
        dict(metadata.get("annotations") or {}),
        frozenset(e.get("name", "") for e in c.get("env") or []),
        str(c.get("name") or ""),
    )


def _limits(limits: Mapping[str, Any]) -> dict[str, str]:
    names = {"cpu": "cpu", "memory": "memory", "ephemeral-storage": "ephemeralStorage"}
    return {names[k]: str(v) for k, v in limits.items() if k in names}


def check_claim(claim_spec: Mapping[str, Any], template_spec: Mapping[str, Any]) -> Refusal | None:
    """What in a claim its template (or sandlot) does not allow, if anything."""
    if claim_spec.get("volumeClaimTemplates"):
        return Refusal(
            Reason.VOLUME_CLAIM_TEMPLATES_ERROR, "spec.volumeClaimTemplates: no volumes yet"
        )
    metadata = claim_spec.get("additionalPodMetadata") or {}
    for kind in ("labels", "annotations"):
        for key in metadata.get(kind) or {}:
            if key.startswith(RESERVED_KEY_PREFIXES):
                return Refusal(
                    Reason.INVALID_METADATA,
                    f"spec.additionalPodMetadata.{kind}: {key} is a key the system sets",
                )
    env = claim_spec.get("env") or []
    if not env:
        return None
    policy = template_spec.get("envVarsInjectionPolicy") or InjectionPolicy.DISALLOWED
    if policy == InjectionPolicy.DISALLOWED:
        return Refusal(
            Reason.ENV_VARS_INJECTION_REJECTED,
            "spec.env: the template's envVarsInjectionPolicy is Disallowed",
        )
    translated = translate_template(template_spec)
    if isinstance(translated, Refusal):
        return translated
    for var in env:
        target = var.get("containerName")
        if target and target != translated.container_name:
            return _invalid(f"spec.env[{var.get('name')}].containerName", f"no container {target}")
        if policy == InjectionPolicy.ALLOWED and var.get("name") in translated.env_names:
            return Refusal(
                Reason.ENV_VARS_INJECTION_REJECTED,
                f"spec.env: {var.get('name')} is the template's; its policy Allowed adds, "
                "Overrides would replace",
            )
    return None


def claim_env(claim_spec: Mapping[str, Any]) -> dict[str, str]:
    """The environment every command run through the claim gets (checked first)."""
    return {str(v["name"]): str(v.get("value") or "") for v in claim_spec.get("env") or []}


def sandlot_claim_spec(claim_spec: Mapping[str, Any]) -> dict[str, Any]:
    """A sandlot claim's spec for an agent-sandbox claim: the pool of its warm pool's
    name, and its lifecycle (DeleteForeground is Delete: sandlot's delete of a claim
    takes its sandbox with it)."""
    spec: dict[str, Any] = {"poolName": (claim_spec.get("warmPoolRef") or {}).get("name", "")}
    lifecycle = claim_spec.get("lifecycle") or {}
    if lifecycle.get("shutdownTime"):
        policy = lifecycle.get("shutdownPolicy") or ClaimShutdownPolicy.RETAIN
        spec["lifecycle"] = {
            "shutdownTime": lifecycle["shutdownTime"],
            "shutdownPolicy": (
                ShutdownPolicy.RETAIN.value
                if policy == ClaimShutdownPolicy.RETAIN
                else ShutdownPolicy.DELETE.value
            ),
        }
        if lifecycle.get("ttlSecondsAfterFinished") is not None:
            spec["lifecycle"]["ttlSecondsAfterFinished"] = lifecycle["ttlSecondsAfterFinished"]
    return spec


def warm_pool_spec(translated: Translated, replicas: int) -> dict[str, Any]:
    """The sandlot pool's spec for a warm pool of ``replicas`` from ``translated``."""
    return {
        "replicas": replicas,
        "template": {
            "metadata": {
                "labels": dict(translated.labels),
                "annotations": dict(translated.annotations),
            },
            "spec": translated.spec,
        },
    }


def spec_hash(spec: Mapping[str, Any]) -> str:
    """A digest of what the warm pool asks of its sandlot pool: the one compared (the
    stored pool carries the API server's defaults, the wanted one does not)."""
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ends_by_deletion(claim_spec: Mapping[str, Any], now: datetime) -> bool:
    """Whether the claim's lifecycle deleted it by now (its sandlot claim went with
    its sandbox at shutdownTime under Delete or DeleteForeground)."""
    lifecycle = claim_spec.get("lifecycle") or {}
    when = parse_time(lifecycle.get("shutdownTime"))
    policy = lifecycle.get("shutdownPolicy") or ClaimShutdownPolicy.RETAIN
    return when is not None and when <= now and policy != ClaimShutdownPolicy.RETAIN


@dataclass(frozen=True)
class SandboxView:
    """The sandlot sandbox a claim is bound to, as the claim's status needs it."""

    name: str
    phase: str
    ready: bool
    paused: bool
    ip: str | None
    node: str | None = None


@dataclass(frozen=True)
class ClaimView:
    """What an agent-sandbox claim and its Sandbox mirror say now."""

    ready: bool
    reason: Reason
    message: str
    sandbox: str = ""
    pod_ips: tuple[str, ...] = ()

    @property
    def final(self) -> bool:
        return not self.ready and self.reason in (Reason.POD_FAILED, Reason.CLAIM_EXPIRED)


def claim_view(sandlot_status: Mapping[str, Any] | None, sandbox: SandboxView | None) -> ClaimView:
    """The agent-sandbox claim's Ready condition from its sandlot claim's status and
    the sandbox bound to it (None: not created yet, or not bound)."""
    if sandlot_status is None:
        return ClaimView(False, Reason.WAITING_FOR_SANDBOX, "claim accepted")
    phase = sandlot_status.get("phase") or ClaimPhase.PENDING
    name = str(sandlot_status.get("sandboxName") or "")
    message = str(sandlot_status.get("message") or "")
    if phase == ClaimPhase.EXPIRED:
        return ClaimView(False, Reason.CLAIM_EXPIRED, message or "claim expired", name)
    if phase == ClaimPhase.LOST:
        return ClaimView(False, Reason.POD_FAILED, message or f"sandbox {name} was lost", name)
    if phase != ClaimPhase.BOUND or sandbox is None:
        return ClaimView(False, Reason.WAITING_FOR_SANDBOX, message or "waiting for a sandbox")
    ips = (sandbox.ip,) if sandbox.ip else ()
    if sandbox.phase == SandboxPhase.RUNNING and sandbox.ready and not sandbox.paused:
        return ClaimView(True, Reason.SANDBOX_READY, f"sandbox {sandbox.name} is ready", name, ips)
    why = "paused" if sandbox.paused else f"{sandbox.phase}, not ready"
    return ClaimView(False, Reason.SANDBOX_NOT_READY, f"sandbox {sandbox.name}: {why}", name, ips)


def warm_pool_status(pool_status: Mapping[str, Any] | None) -> dict[str, Any]:
    """A warm pool's replicas, readyReplicas and selector from its sandlot pool's."""
    status = pool_status or {}
    return {
        "replicas": int(status.get("running") or 0) + int(status.get("pending") or 0),
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "selector": str(status.get("selector") or ""),
    }


def differs(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    return any(current.get(k) != v for k, v in wanted.items())


def owned_by(body: Mapping[str, Any] | None, uid: str) -> bool:
    refs: Sequence[Mapping[str, Any]] = (body or {}).get("metadata", {}).get(
        "ownerReferences"
    ) or []
    return any(r.get("uid") == uid for r in refs)
