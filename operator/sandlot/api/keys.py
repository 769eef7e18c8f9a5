"""Every label, annotation and finalizer key sandlot writes or selects on.

These strings are part of the API as much as the CRD fields are: they sit on
objects in etcd and on containers and images in containerd, outlive any one
release, and other programs (``kubectl -l``, a CNI plugin's logs, the chart)
read them. Keeping them in one module makes the whole vocabulary reviewable at
once and a rename a one-line change that every reader follows.
"""

from __future__ import annotations

from typing import Final

from sandlot.api.common import GROUP

# --- Kubernetes object labels -------------------------------------------------

POOL_LABEL: Final = f"{GROUP}/pool"
"""Sandbox and Service label: name of the SandboxPool that owns the object."""

CLAIM_LABEL: Final = f"{GROUP}/claim"
"""Sandbox label: name of the SandboxClaim the sandbox is bound to (it left its pool)."""

CLAIMED_FROM_LABEL: Final = f"{GROUP}/claimed-from"
"""Sandbox label: the SandboxPool a claimed sandbox was taken from."""

CLAIMED_AT_ANNOTATION: Final = f"{GROUP}/claimed-at"
"""Sandbox annotation: when a claim took it from its pool (RFC 3339, the operator's
clock), for people; no decision compares it with a node's time."""

CLAIMED_IDLE_ANNOTATION: Final = f"{GROUP}/claimed-idle"
"""Sandbox annotation: the idle pause or suspension a claim found it in when it took
it (``policy.idle.idle_mark``: the condition's type and its agent-written time),
absent when it was not idle. Its agent tells from it, by equality with the
condition it sees, whether the idle came before the claim (then the claim wakes
it), even after a restart."""

AGENT_SANDBOX_SPEC_ANNOTATION: Final = f"{GROUP}/agent-sandbox-spec"
"""SandboxPool annotation: a digest of the spec an agent-sandbox SandboxWarmPool and
its template ask of the pool made for it (``policy.agentsandbox.spec_hash``); a new
digest is what makes the operator write the pool's spec again."""

LEVEL_LABEL: Final = f"{GROUP}/enforce"
"""Namespace label: the sandbox policy level (``privileged``, ``baseline``,
``restricted``) enforced on Sandboxes in that namespace."""

MEMORY_LIMIT_LABEL: Final = f"{GROUP}/memory-limit"
"""containerd container label: its sandbox's memory limit in bytes, as its start
decided it (its own, its namespace's default or the agent's): what capacity counts."""

CPU_LIMIT_LABEL: Final = f"{GROUP}/cpu-limit"
"""containerd container label: its sandbox's CPU limit in thousandths of a CPU, as
its start decided it."""

EPHEMERAL_STORAGE_LABEL: Final = f"{GROUP}/ephemeral-storage-limit"
"""containerd container label: its sandbox's disk limit in bytes, decided when it
started (its own, else its namespace's default); the agent measures only these."""

USERNS_LABEL: Final = f"{GROUP}/userns"
"""containerd container label: the host IDs of its sandbox's user namespace, as
``<first>-<size>`` (``hostUsers: false``); the agent reads them back to hand out
ranges no running sandbox holds."""

RUNTIME_HANDLERS_LABEL: Final = f"{GROUP}/runtime-handlers"
"""Kubernetes Node label, set by the cluster's admins (never by an agent): the
non-default runtime handlers the node is confirmed to have, dot-separated
(``gvisor.crun``; a label value has no commas). Placement trusts a node's own
``status.runtimeHandlers`` for such a handler only with this label or a
RuntimeClass node selector the Node's labels match."""

TAINTED_LABEL: Final = f"{GROUP}/tainted"
"""SandboxNode label (value ``"true"``), kept by the operator: the node has a
NoSchedule or NoExecute taint (its own or its Kubernetes Node's). The placement
admission policy evaluates only the nodes that carry it."""

AGENT_LEASE_LABEL: Final = f"{GROUP}/agent-lease"
"""Lease label (value ``"true"``): the Lease is a node agent's heartbeat."""

DEFAULT_LIMITS_ANNOTATION: Final = f"{GROUP}/default-limits"
"""Namespace annotation: the limits of its Sandboxes that set none, as
``memory=512Mi,cpu=500m,pids=256,ephemeralStorage=1Gi`` (any subset); the agent's
settings fill the rest (a disk limit has no node-wide default)."""

DEFAULT_NETWORK_POLICY_ANNOTATION: Final = f"{GROUP}/default-network-policy"
"""Namespace annotation: the network policy of its Sandboxes that set none, as the
JSON of a ``spec.networkPolicy`` (``{"egress": [{"to": [{"ipBlock": {"cidr":
"10.0.0.53/32"}}]}]}``); its ``ingress`` and ``egress`` each stand in for a Sandbox's
missing one. The cluster default (the agent's settings) applies underneath."""

APP_NAME_LABEL: Final = "app.kubernetes.io/name"
"""Recommended Kubernetes label naming the application an object belongs to."""

APP_NAME: Final = "sandlot"
"""Value of ``APP_NAME_LABEL`` on the objects sandlot creates cluster-wide."""

SERVICE_NAME_LABEL: Final = "kubernetes.io/service-name"
"""EndpointSlice label (Kubernetes' own): the Service the slice belongs to."""

ENDPOINTSLICE_MANAGED_BY_LABEL: Final = "endpointslice.kubernetes.io/managed-by"
"""EndpointSlice label (Kubernetes' own): the controller owning the slice, so the
built-in EndpointSlice controller leaves sandlot's slices alone."""

ENDPOINTSLICE_MANAGER: Final = GROUP
"""Value of ``ENDPOINTSLICE_MANAGED_BY_LABEL`` on the slices sandlot writes."""

SERVICE_MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
"""Service label (Kubernetes' recommended one): the tool managing the object. The
operator writes only Services carrying it with ``SERVICE_MANAGER`` (an admission
policy holds it to that), so a Service someone else made is never taken over."""

SERVICE_MANAGER: Final = GROUP
"""Value of ``SERVICE_MANAGED_BY_LABEL`` on the Services sandlot writes (the chart's
own objects say ``Helm``)."""

# --- containerd container and image labels -------------------------------------

SANDBOX_LABEL: Final = f"{GROUP}/sandbox"
"""Container label: "namespace/name" of the Sandbox the container runs."""

SANDBOX_UID_LABEL: Final = f"{GROUP}/sandbox-uid"
"""Container label: metadata.uid of that Sandbox (a recreated one differs)."""

NETNS_LABEL: Final = f"{GROUP}/netns"
"""Container label: path of the sandbox's network namespace (empty: none made)."""

NETWORK_LABEL: Final = f"{GROUP}/cni-network"
"""Container label: ``name`` of the CNI network configuration it was attached to."""

IFNAME_LABEL: Final = f"{GROUP}/cni-ifname"
"""Container label: the interface name given to CNI (``CNI_IFNAME``)."""

LAST_USED_LABEL: Final = f"{GROUP}/last-used"
"""Image label: RFC 3339 time a sandbox last started from the image."""

PULLED_BY_AGENT_LABEL: Final = f"{GROUP}/pulled-by-agent"
"""Image label: the agent pulled this image (an image without it is preloaded)."""

# --- kopf's bookkeeping on SandboxNodes ------------------------------------------

KOPF_ANNOTATION_PREFIX: Final = GROUP
"""Prefix of the annotations kopf keeps its handler progress in
(``sandlot.dev/<handler-id>``), instead of in sandlot's status."""

LAST_HANDLED_CONFIGURATION_KEY: Final = "last-handled-configuration"
"""Annotation name (under ``KOPF_ANNOTATION_PREFIX``) holding kopf's diff base."""

NODE_HEALTH_FINALIZER: Final = f"{GROUP}/node-health"
"""Finalizer on every SandboxNode: its deletion waits until the operator has
marked the node's sandboxes Dead."""
SNAPSHOT_FINALIZER: Final = f"{GROUP}/snapshot-in-use"
"""On a SandboxSnapshot: kept while a live Sandbox or a pool template names it."""

# --- Certificates -------------------------------------------------------------

AGENT_SIGNER: Final = f"{GROUP}/agent-serving"
"""``spec.signerName`` of the CertificateSigningRequests in which a node's agent asks
for its serving certificate; sandlot's operator alone approves and signs them, with
the agent CA whose key only it holds (``policy.agentcerts``)."""

NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
"""User-info extra of a ServiceAccount token bound to a Pod: the Pod's node, put
there by the API server (a CertificateSigningRequest records it in ``spec.extra``)."""

POD_NAME_EXTRA: Final = "authentication.kubernetes.io/pod-name"
"""User-info extra of a ServiceAccount token bound to a Pod: that Pod's name."""

__all__ = [
    "AGENT_LEASE_LABEL",
    "AGENT_SANDBOX_SPEC_ANNOTATION",
    "AGENT_SIGNER",
    "APP_NAME",
    "APP_NAME_LABEL",
    "CLAIMED_AT_ANNOTATION",
    "CLAIMED_FROM_LABEL",
    "CLAIMED_IDLE_ANNOTATION",
    "CLAIM_LABEL",
    "CPU_LIMIT_LABEL",
    "DEFAULT_LIMITS_ANNOTATION",
    "ENDPOINTSLICE_MANAGED_BY_LABEL",
    "ENDPOINTSLICE_MANAGER",
    "EPHEMERAL_STORAGE_LABEL",
    "IFNAME_LABEL",
    "KOPF_ANNOTATION_PREFIX",
    "LAST_HANDLED_CONFIGURATION_KEY",
    "LAST_USED_LABEL",
    "LEVEL_LABEL",
    "MEMORY_LIMIT_LABEL",
    "NETNS_LABEL",
    "NETWORK_LABEL",
    "NODE_HEALTH_FINALIZER",
    "NODE_NAME_EXTRA",
    "POD_NAME_EXTRA",
    "POOL_LABEL",
    "PULLED_BY_AGENT_LABEL",
    "RUNTIME_HANDLERS_LABEL",
    "SANDBOX_LABEL",
    "SANDBOX_UID_LABEL",
    "SERVICE_MANAGED_BY_LABEL",
    "SERVICE_MANAGER",
    "SERVICE_NAME_LABEL",
    "SNAPSHOT_FINALIZER",
    "TAINTED_LABEL",
    "USERNS_LABEL",
]
