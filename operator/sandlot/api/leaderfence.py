"""The leader fence: the API server admits the operator's leader-only writes only
from the current holder of the leader-election Lease.

The operator fences itself (``adapters.kube.WriteFence``): it asks, just before it
sends a write, whether it still leads on its own monotonic clock. A process paused
between that question and the send (a GC pause, a frozen VM, SIGSTOP) wakes up
with the write already judged, and sends it after its successor has started. The
resourceVersion precondition stops it from clobbering an object that changed
meanwhile, but not a stale mark on one that did not (a node that recovered while
the new leader left its sandboxes Running). Only the server sees both writes in
one order, so only the server can close that hole.

A ValidatingAdmissionPolicy with the Lease as its parameter does: each operator
replica's leader-election identity is its pod's name (the chart sets it from the
downward API), and its ServiceAccount token is bound to that pod, so the API
server puts the pod's name into the request's user info
(``authentication.kubernetes.io/pod-name``). A write is admitted only when that
name is ``spec.holderIdentity`` of the Lease:

- ``operator-bound-token``: a write without the pod-name claim is refused;
- ``leader-lease-holder``: a write from any pod but the Lease's holder is refused;
- no Lease at all: the binding stands aside (``parameterNotFoundAction: Allow``).
  Deny would be worse than no fence: the API server resolves a binding's parameter
  before it evaluates the policy's match conditions, so a missing Lease would
  refuse every identity's writes of the matched kinds, cluster-wide (tenants'
  Sandboxes, everyone's Services) from the install until the first election, and
  whenever the Lease is deleted. Nothing leads without the Lease either: a replica
  leads only once its create or update of the Lease has landed, and from then on
  the Lease names it and the fence engages against everyone else. A Lease deleted
  under its holder leaves that holder in the position of an expired Lease (below).

What it covers: the writes only the leader sends (Sandboxes and their status, the
status of SandboxNodes, SandboxPools, SandboxClaims and CachePrunes, the Services
and EndpointSlices of routing). Not the Lease, which every candidate must be able
to take; not a SandboxNode itself (kopf's finalizer and annotations, written by
every replica); not Events (best effort, and kopf posts its own from every replica).

What it leaves to the client fence: an expired Lease still naming its old holder.
CEL in admission has no clock (no ``now``; the request carries no time), so the
policy cannot compare ``spec.renewTime + leaseDurationSeconds`` with the present.
It need not: while the Lease still names the old holder, no successor has taken it,
so no other replica is writing; the moment a successor's takeover lands, the old
holder's writes are refused. The client fence stops the holder itself at its renew
deadline, which falls before any successor may take over.

The API server evaluates the policy against its informer's copy of the Lease, which
trails a takeover by milliseconds: the new holder's first writes may be refused
(the operator retries them, ``adapters.kube``), and the old holder's writes are
refused from the moment the informer has seen the takeover. One API server's
informer is one order: no instant admits both.
"""

from __future__ import annotations

from typing import Any

from sandlot.api.common import GROUP
from sandlot.api.writepolicy import (
    PLACEHOLDERS,
    Identities,
    cel_validation,
    helm_body,
    policy_objects,
    resource_rule,
)

CHART_TEMPLATE = "charts/sandlot/templates/leader-fence.yaml"
POD_NAME_CLAIM = "authentication.kubernetes.io/pod-name"
"""Key in a pod-bound ServiceAccount token's user extra info: the pod's name."""

LEADER_ONLY_RESOURCES = (
    "sandboxes",
    "sandboxes/status",
    "sandboxnodes/status",
    "sandboxpools/status",
    "sandboxclaims/status",
    "cacheprunes/status",
)
"""sandlot's resources only the leader writes (a SandboxNode itself is not: kopf
keeps its finalizer and annotations there from every replica)."""


HOLDER_RULE = "leader-lease-holder"


def refused_as_non_holder(message: str) -> bool:
    """Whether an API server's refusal is this policy's: the caller is not (as far
    as the server has seen) the holder of the leader Lease."""
    return f"-leader-fence: rule {HOLDER_RULE}:" in message


def policy_name(ids: Identities) -> str:
    return f"{ids.fullname}-leader-fence"


def leader_fence_policy(ids: Identities) -> list[dict[str, Any]]:
    """The policy and its binding, the binding's parameter the leader Lease."""
    name = policy_name(ids)
    pod = (
        f"'{POD_NAME_CLAIM}' in request.userInfo.extra && "
        f"size(request.userInfo.extra['{POD_NAME_CLAIM}']) == 1 ? "
        f"request.userInfo.extra['{POD_NAME_CLAIM}'][0] : ''"
    )
    what = (
        "request.operation.lowerAscii() + ' ' + request.resource.resource + "
        "(has(request.subResource) && request.subResource != '' ? '/' + request.subResource "
        ": '') + ' ' + (request.namespace == '' ? '' : request.namespace + '/') + request.name"
    )
    lease = f"{ids.namespace}/{ids.leader_lease}"
    prefix = f"'{name}: rule "
    validations = [
        cel_validation(
            "variables.pod != ''",
            f"{prefix}operator-bound-token: the token of ' + request.userInfo.username + ' "
            f"carries no {POD_NAME_CLAIM} claim, so it cannot be matched with the holder of "
            f"Lease {lease}; the operator must use a ServiceAccount token bound to its pod, "
            f"whose name is its leader-election identity; refused ' + {what}",
        ),
        cel_validation(
            "variables.pod == '' || variables.pod == variables.holder",
            f"{prefix}{HOLDER_RULE}: only the holder of Lease {lease} writes; it is "
            "held by ' + (variables.holder == '' ? 'nobody' : variables.holder) + ', "
            f"refused ' + {what} + ' from pod ' + variables.pod",
        ),
    ]
    objects = policy_objects(
        name,
        [
            resource_rule(GROUP, *LEADER_ONLY_RESOURCES),
            resource_rule("", "services"),
            resource_rule("discovery.k8s.io", "endpointslices"),
        ],
        validations,
        user=ids.operator_user,
        variables=[
            {"name": "pod", "expression": pod},
            {"name": "holder", "expression": "params.spec.?holderIdentity.orValue('')"},
        ],
    )
    policy, binding = objects
    policy["spec"] = {
        "paramKind": {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"},
        **policy["spec"],
    }
    binding["spec"]["paramRef"] = {
        "name": ids.leader_lease,
        "namespace": ids.namespace,
        "parameterNotFoundAction": "Allow",
    }
    return objects


def chart_template() -> str:
    """The chart's ``templates/leader-fence.yaml``: installed with the write policies,
    unless ``writePolicies.leaderFence`` is off or there is no leader election (no
    Lease: the policy would refuse every write)."""
    body = helm_body(leader_fence_policy(PLACEHOLDERS))
    return (
        "# Generated by `sandlot gen admission` from sandlot/api/leaderfence.py; do not edit.\n"
        "{{- if and .Values.writePolicies.enabled .Values.writePolicies.leaderFence "
        ".Values.operator.leaderElection.enabled }}\n"
        '{{- $fullname := include "sandlot.fullname" . }}\n'
        '{{- $operatorSA := include "sandlot.operatorServiceAccount" . }}\n'
        "{{- $lease := .Values.operator.leaderElection.leaseName }}\n"
        f"{body}"
        "{{- end }}\n"
    )
