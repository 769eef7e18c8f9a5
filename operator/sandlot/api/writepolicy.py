"""What sandlot's own identities may write, enforced by the API server.

Kubernetes bounds a kubelet with the NodeRestriction admission plugin: a node's
credentials write only that node's objects. sandlot's agent runs on every node
(its DaemonSet tolerates every taint), so its ServiceAccount token sits on every
node too; RBAC alone would let one compromised node rewrite every SandboxNode,
every sandbox's status and the operator's leader Lease. The agent's token is
bound to its pod, and the API server puts the pod's node into the token's user
info (``authentication.kubernetes.io/node-name``, Kubernetes 1.30 and later), so
a ValidatingAdmissionPolicy can hold each agent to its own node:

- ``agent-bound-token``: a write without the node-name claim is refused;
- ``agent-own-sandboxnode``: it creates its own SandboxNode and writes its status;
- ``agent-bare-sandboxnode``: with no labels, since placement matches sandboxes'
  ``nodeSelector`` and affinity against them (a node labelling itself ``gpu=true``
  would draw other tenants' sandboxes); a status write cannot change them;
- ``agent-node-status-not-operators``: but not the status fields the operator
  owns: the node-health controller's (phase, conditions, health tracking) and the
  taints placement trusts (``trustedNodeTaints``, copied from the Kubernetes Node:
  a node clearing them would draw sandboxes its Node's taints keep off);
- ``agent-not-leader-lease`` / ``agent-own-lease``: its own node Lease in sandlot's
  namespace, held by itself; never the leader Lease, never another node's;
- ``agent-sandbox-status-on-its-node``: status only, of Sandboxes whose
  ``spec.nodeName`` is its node;
- ``agent-cacheprune-own-entry``: status only, of a CachePrune, changing only
  ``status.results[<its node>]``;
- ``agent-events-about-its-node``: Events about its SandboxNode, or about a
  Sandbox with ``source.host`` its node (an admission policy cannot read the
  Sandbox to check its node, so an event always names the node that wrote it).

The operator is held to what it manages (``operator-managed-services``,
``operator-managed-endpointslices``): it creates, changes and deletes only
Services and EndpointSlices carrying sandlot's managed-by label, and cannot adopt
a foreign one by adding the label (the old object must carry it too).

``node-name-not-leader-lease`` refuses, for everyone, a SandboxNode named like
the leader Lease: the node's agent would renew the operator's Lease as its own.

Reads cannot be narrowed this way: admission sees only writes, and RBAC cannot
say "only with this field selector". The agent selects its node's objects
server-side (``spec.nodeName``, ``metadata.name``), and its RBAC grants no read
beyond what it watches.

Every identity and name is a parameter; ``chart_template()`` writes the chart's
``templates/write-policies.yaml`` with Helm expressions in their place, and a
test fails when the committed template has drifted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import BaseModel

from sandlot.api.cacheprune import CachePruneStatus
from sandlot.api.common import GROUP
from sandlot.api.keys import (
    APP_NAME,
    APP_NAME_LABEL,
    ENDPOINTSLICE_MANAGED_BY_LABEL,
    ENDPOINTSLICE_MANAGER,
    SERVICE_MANAGED_BY_LABEL,
    SERVICE_MANAGER,
)
from sandlot.api.node import SandboxNodeStatus

CHART_TEMPLATE = "charts/sandlot/templates/write-policies.yaml"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
"""Key in a pod-bound ServiceAccount token's user extra info: the pod's node."""


@dataclass(frozen=True)
class Identities:
    """The names the policies are written for (one Helm release's)."""

    fullname: str
    namespace: str
    agent_service_account: str
    operator_service_account: str
    leader_lease: str

    @property
    def agent_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.agent_service_account}"

    @property
    def operator_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.operator_service_account}"


def resource_rule(group: str, *resources: str) -> dict[str, Any]:
    return {
        "apiGroups": [group],
        "apiVersions": ["*"],
        "operations": ["CREATE", "UPDATE", "DELETE"],
        "resources": list(resources),
    }


def cel_validation(expression: str, message: str) -> dict[str, Any]:
    return {"expression": expression, "messageExpression": message, "reason": "Forbidden"}


def _metadata(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {APP_NAME_LABEL: APP_NAME}}


def policy_objects(
    name: str,
    rules: list[dict[str, Any]],
    validations: list[dict[str, Any]],
    *,
    user: str | None = None,
    variables: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    spec: dict[str, Any] = {"failurePolicy": "Fail", "matchConstraints": {"resourceRules": rules}}
    if user is not None:
        spec["matchConditions"] = [
            {"name": "is-the-identity", "expression": f"request.userInfo.username == '{user}'"}
        ]
    if variables:
        spec["variables"] = variables
    spec["validations"] = validations
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(name),
        "spec": spec,
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _metadata(name),
        "spec": {"policyName": name, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def _cel_literal(value: object) -> str | None:
    """``value`` as a CEL literal; None for values with none (objects)."""
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple) and not value:
        return "[]"
    if isinstance(value, int):
        return str(value)
    return None


def _aliases(model: type[BaseModel], fields: Iterable[str]) -> list[str]:
    return [model.model_fields[n].alias or n for n in fields]


def _status_kept(model: type[BaseModel], fields: Iterable[str]) -> str:
    """CEL: the update leaves these status fields of ``model`` as they were. A field
    with a scalar or list default is read with it, so a status the agent's patch
    creates (and the API server defaults) compares equal to an absent one."""
    checks = []
    for name in fields:
        info = model.model_fields[name]
        field = info.alias or name
        default = _cel_literal(info.get_default(call_default_factory=True))
        if default is None:
            checks.append(f"object.?status.?{field} == oldObject.?status.?{field}")
        else:
            checks.append(
                f"object.?status.?{field}.orValue({default}) == "
                f"oldObject.?status.?{field}.orValue({default})"
            )
    return " && ".join(checks)


NODE_STATUS_OF_THE_OPERATOR = ("phase", "conditions", "health", "trusted_node_taints")
"""SandboxNode status fields the operator owns (node health's, and the taints placement
trusts); its agent keeps off them."""

CACHEPRUNE_STATUS_OF_THE_OPERATOR = tuple(
    n for n in CachePruneStatus.model_fields if n != "results"
)
"""CachePrune status fields the operator owns: all but the per-node ``results``."""


# CEL spelled once: the agent's node, the resource written, the object written
# (the old one for a DELETE), and " node <N> " inside a message string.
_NODE = "variables.node"
_RESOURCE = "request.resource.resource"
_OBJ = "variables.obj"
_WHO = f" node ' + {_NODE} + ' "


def _agent_variables() -> list[dict[str, Any]]:
    resource, obj = _RESOURCE, _OBJ
    return [
        {
            "name": "node",
            "expression": f"'{NODE_NAME_CLAIM}' in request.userInfo.extra && "
            f"size(request.userInfo.extra['{NODE_NAME_CLAIM}']) == 1 ? "
            f"request.userInfo.extra['{NODE_NAME_CLAIM}'][0] : ''",
        },
        {"name": "obj", "expression": "request.operation == 'DELETE' ? oldObject : object"},
        {
            "name": "status",
            "expression": "has(request.subResource) && request.subResource == 'status'",
        },
        {"name": "isEvent", "expression": f"{resource} == 'events'"},
        {
            "name": "about",
            "expression": "!variables.isEvent ? null : request.resource.group == '' ? "
            f"{obj}.involvedObject : {obj}.regarding",
        },
        {
            "name": "reporter",
            "expression": "!variables.isEvent ? '' : request.resource.group == '' ? "
            f"{obj}.?source.?host.orValue('') : {obj}.?reportingInstance.orValue('')",
        },
    ]


def _agent_node_rules(ids: Identities) -> list[dict[str, Any]]:
    """Rules on the node's own objects: its SandboxNode and its Lease."""
    node, resource, obj, who = _NODE, _RESOURCE, _OBJ, _WHO
    prefix = f"'{ids.fullname}-agent-writes: rule "
    return [
        cel_validation(
            f"{node} != ''",
            f"{prefix}agent-bound-token: the token carries no {NODE_NAME_CLAIM} claim; "
            "the agent must use a ServiceAccount token bound to its pod'",
        ),
        cel_validation(
            f"{resource} != 'sandboxnodes' || ({obj}.metadata.name == {node} && "
            "(request.operation == 'CREATE' && !variables.status || "
            "request.operation == 'UPDATE' && variables.status))",
            f"{prefix}agent-own-sandboxnode:{who}may create SandboxNode ' + {node} + "
            f"' and write its status only, not ' + request.operation.lowerAscii() + ' ' + "
            f"{resource} + (variables.status ? '/status ' : ' ') + {obj}.metadata.name",
        ),
        cel_validation(
            f"{resource} != 'sandboxnodes' || request.operation != 'CREATE' || "
            f"size({obj}.metadata.?labels.orValue({{}})) == 0",
            f"{prefix}agent-bare-sandboxnode:{who}may not label the SandboxNode it creates "
            "(placement matches nodeSelector and affinity against its labels): asked for ' + "
            f"{obj}.metadata.labels.map(k, k).join(', ')",
        ),
        cel_validation(
            f"{resource} != 'sandboxnodes' || !variables.status || request.operation != 'UPDATE' "
            f"|| ({_status_kept(SandboxNodeStatus, NODE_STATUS_OF_THE_OPERATOR)})",
            f"{prefix}agent-node-status-not-operators:{who}may not change status."
            f"{', status.'.join(_aliases(SandboxNodeStatus, NODE_STATUS_OF_THE_OPERATOR))} "
            "of its SandboxNode: the operator owns them'",
        ),
        cel_validation(
            f"{resource} != 'leases' || {obj}.metadata.name != '{ids.leader_lease}'",
            f"{prefix}agent-not-leader-lease: the Lease {ids.namespace}/{ids.leader_lease} "
            "is the operator leader election Lease; no agent writes it'",
        ),
        cel_validation(
            f"{resource} != 'leases' || (request.operation != 'DELETE' && "
            f"request.namespace == '{ids.namespace}' && {obj}.metadata.name == {node} && "
            f"{obj}.spec.?holderIdentity.orValue('') == {node})",
            f"{prefix}agent-own-lease:{who}may create and renew only its own Lease "
            f"{ids.namespace}/' + {node} + ' held by itself, not ' + "
            f"request.operation.lowerAscii() + ' ' + request.namespace + '/' + "
            f"{obj}.metadata.name",
        ),
    ]


def _agent_workload_rules(ids: Identities) -> list[dict[str, Any]]:
    """Rules on what runs on the node: Sandbox and SandboxSnapshot status, CachePrune
    results, Events."""
    node, resource, obj, who = _NODE, _RESOURCE, _OBJ, _WHO
    prefix = f"'{ids.fullname}-agent-writes: rule "
    results = "object.?status.?results.orValue({})"
    old_results = "oldObject.?status.?results.orValue({})"
    return [
        cel_validation(
            f"{resource} != 'sandboxes' || (request.operation == 'UPDATE' && variables.status "
            f"&& oldObject.spec.?nodeName.orValue('') == {node} && "
            f"object.spec.?nodeName.orValue('') == {node})",
            f"{prefix}agent-sandbox-status-on-its-node:{who}may write only the status of "
            "Sandboxes whose spec.nodeName is ' + " + node + " + ', not ' + "
            f"request.operation.lowerAscii() + ' ' + request.namespace + '/' + "
            f"{obj}.metadata.name + (variables.status ? ' status' : '') + ' (spec.nodeName ' "
            f"+ {obj}.spec.?nodeName.orValue('unset') + ')'",
        ),
        cel_validation(
            f"{resource} != 'sandboxsnapshots' || (request.operation == 'UPDATE' && "
            f"variables.status && oldObject.spec.?nodeName.orValue('') == {node} && "
            f"object.spec.?nodeName.orValue('') == {node})",
            f"{prefix}agent-snapshot-status-on-its-node:{who}may write only the status of "
            "SandboxSnapshots whose spec.nodeName is ' + " + node + " + ', not ' + "
            f"request.operation.lowerAscii() + ' ' + request.namespace + '/' + "
            f"{obj}.metadata.name + (variables.status ? ' status' : '') + ' (spec.nodeName ' "
            f"+ {obj}.spec.?nodeName.orValue('unset') + ')'",
        ),
        cel_validation(
            f"{resource} != 'cacheprunes' || (request.operation == 'UPDATE' && variables.status "
            f"&& {results}.all(k, k == {node} || k in {old_results} && "
            f"{old_results}[k] == {results}[k]) && "
            f"{old_results}.all(k, k == {node} || k in {results}) && "
            f"{_status_kept(CachePruneStatus, CACHEPRUNE_STATUS_OF_THE_OPERATOR)})",
            f"{prefix}agent-cacheprune-own-entry:{who}may change only status.results.' + "
            f"{node} + ' of a CachePrune, not ' + request.operation.lowerAscii() + ' ' + "
            f"{resource} + (variables.status ? '/status ' : ' ') + {obj}.metadata.name + "
            "' beyond it'",
        ),
        cel_validation(
            f"!variables.isEvent || (variables.about.kind == 'SandboxNode' && "
            f"variables.about.name == {node}) || (variables.about.kind == 'Sandbox' && "
            f"variables.reporter == {node})",
            f"{prefix}agent-events-about-its-node:{who}may post Events only about SandboxNode "
            f"' + {node} + ' or about Sandboxes reported from ' + {node} + ' (source.host), "
            "not about ' + variables.about.kind + ' ' + variables.about.name + ' from ' + "
            "(variables.reporter == '' ? 'no node' : variables.reporter)",
        ),
    ]


def agent_policy(ids: Identities) -> list[dict[str, Any]]:
    """The agent's node boundary: a policy matching only the agent's identity."""
    rules = [
        resource_rule(
            GROUP,
            "sandboxnodes",
            "sandboxnodes/status",
            "sandboxes",
            "sandboxes/status",
            "sandboxsnapshots",
            "sandboxsnapshots/status",
            "cacheprunes",
            "cacheprunes/status",
        ),
        resource_rule("coordination.k8s.io", "leases"),
        resource_rule("", "events"),
        resource_rule("events.k8s.io", "events"),
    ]
    return policy_objects(
        f"{ids.fullname}-agent-writes",
        rules,
        [*_agent_node_rules(ids), *_agent_workload_rules(ids)],
        user=ids.agent_user,
        variables=_agent_variables(),
    )


def _managed(label: str, value: str, rule: str, kind: str, ids: Identities) -> dict[str, Any]:
    has_new = f"object.metadata.?labels[?'{label}'].orValue('') == '{value}'"
    had_old = f"oldObject.metadata.?labels[?'{label}'].orValue('') == '{value}'"
    return cel_validation(
        f"(request.operation == 'CREATE' || {had_old}) && "
        f"(request.operation == 'DELETE' || {has_new})",
        f"'{ids.fullname}-operator-writes: rule {rule}: the operator writes only {kind} "
        f"labelled {label}={value}; refused ' + request.operation.lowerAscii() + ' of ' + "
        "request.namespace + '/' + request.name",
    )


def operator_policy(ids: Identities) -> list[dict[str, Any]]:
    """The operator writes only the Services and EndpointSlices it labelled as its own."""
    is_service = "request.resource.resource == 'services'"
    services = _managed(
        SERVICE_MANAGED_BY_LABEL, SERVICE_MANAGER, "operator-managed-services", "Services", ids
    )
    slices = _managed(
        ENDPOINTSLICE_MANAGED_BY_LABEL,
        ENDPOINTSLICE_MANAGER,
        "operator-managed-endpointslices",
        "EndpointSlices",
        ids,
    )
    services["expression"] = f"!({is_service}) || ({services['expression']})"
    slices["expression"] = f"{is_service} || ({slices['expression']})"
    return policy_objects(
        f"{ids.fullname}-operator-writes",
        [resource_rule("", "services"), resource_rule("discovery.k8s.io", "endpointslices")],
        [services, slices],
        user=ids.operator_user,
    )


def node_name_policy(ids: Identities) -> list[dict[str, Any]]:
    """No SandboxNode may share its name with the leader Lease (for every identity)."""
    rule = {**resource_rule(GROUP, "sandboxnodes"), "operations": ["CREATE"]}
    return policy_objects(
        f"{ids.fullname}-node-names",
        [rule],
        [
            cel_validation(
                f"object.metadata.name != '{ids.leader_lease}'",
                f"'{ids.fullname}-node-names: rule node-name-not-leader-lease: SandboxNode "
                f"{ids.leader_lease} would share its node Lease with the operator leader "
                f"election Lease {ids.namespace}/{ids.leader_lease}; rename the node or set "
                "operator.leaderElection.leaseName'",
            )
        ],
    )


def write_policies(ids: Identities) -> list[dict[str, Any]]:
    """Every policy and binding of this module, in the chart's order."""
    return [*agent_policy(ids), *operator_policy(ids), *node_name_policy(ids)]


PLACEHOLDERS = Identities(
    fullname="@@FULLNAME@@",
    namespace="@@NAMESPACE@@",
    agent_service_account="@@AGENT_SA@@",
    operator_service_account="@@OPERATOR_SA@@",
    leader_lease="@@LEADER_LEASE@@",
)
_HELM = {
    "@@FULLNAME@@": "{{ $fullname }}",
    "@@NAMESPACE@@": "{{ .Release.Namespace }}",
    "@@AGENT_SA@@": "{{ $agentSA }}",
    "@@OPERATOR_SA@@": "{{ $operatorSA }}",
    "@@LEADER_LEASE@@": "{{ $lease }}",
}


def helm_body(objects: list[dict[str, Any]]) -> str:
    """``objects`` (built for ``PLACEHOLDERS``) as YAML documents with the release's
    Helm expressions in place of the placeholder names."""
    body = "---\n".join(yaml.safe_dump(obj, sort_keys=False, width=1000) for obj in objects)
    for placeholder, helm in _HELM.items():
        body = body.replace(placeholder, helm)
    return body


def chart_template() -> str:
    """The chart's ``templates/write-policies.yaml``: the same objects, with the
    release's names (each a DNS name, checked by Kubernetes or the values schema,
    so none can break out of a CEL string literal)."""
    body = helm_body(write_policies(PLACEHOLDERS))
    return (
        "# Generated by `sandlot gen admission` from sandlot/api/writepolicy.py; do not edit.\n"
        "{{- if .Values.writePolicies.enabled }}\n"
        '{{- $fullname := include "sandlot.fullname" . }}\n'
        '{{- $agentSA := include "sandlot.agentServiceAccount" . }}\n'
        '{{- $operatorSA := include "sandlot.operatorServiceAccount" . }}\n'
        "{{- $lease := .Values.operator.leaderElection.leaseName }}\n"
        f"{body}"
        "{{- end }}\n"
    )
