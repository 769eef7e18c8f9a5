"""A hand-set ``spec.nodeName`` onto a tainted SandboxNode is refused by the API
server unless the sandbox tolerates the taint.

The scheduler honours taints, but ``spec.nodeName`` set by hand skips it, and the
agent's own refusal (``PlacementRefused``) comes only once the sandbox reached the
node. A ValidatingAdmissionPolicy cannot look up the node a Sandbox names; what it
can do is take SandboxNodes as parameters (``paramKind``) chosen by a label
selector, and evaluate once per selected node. So:

- the operator copies the blocking taints of each SandboxNode's Kubernetes Node
  into its ``status.trustedNodeTaints`` (the agent's own mirror,
  ``status.nodeTaints``, only where no Node exists: a compromised node may clear
  it), and keeps the label ``sandlot.dev/tainted=true`` on every SandboxNode with a
  NoSchedule or NoExecute taint there or in ``spec.taints``, removing it when there
  is none (``sandlot.policy.nodetrust.admission_marks``). The agent's write policy
  keeps it off both (``sandlot.api.writepolicy``); the policy reads nothing else;
- the binding selects the labelled nodes; for each, the policy refuses a Sandbox
  whose new ``spec.nodeName`` is that node and which leaves one of its blocking
  taints untolerated, with ``sandlot.policy.placement``'s matching rules written in
  CEL (effect empty or equal; ``Exists`` with no key matches every taint, with a
  key that key; ``Equal`` key and value);
- a fleet with no tainted node selects nothing, and ``parameterNotFoundAction:
  Allow`` lets every Sandbox through without evaluating anything.

The cost: every create or update that sets a new ``spec.nodeName`` (each bind of
the scheduler included) is evaluated once per tainted node, each evaluation a
name comparison that stops there for every node but the one named. The API
server reads the parameters from its own watch cache, never etcd. Only the
match condition (a new ``spec.nodeName``) keeps the rest of the Sandbox writes
free of it.

Between a taint being set and the operator copying it, a hand-placed sandbox
passes admission; an honest agent still refuses it.
"""

from __future__ import annotations

from typing import Any

import yaml

from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import APP_NAME, APP_NAME_LABEL, TAINTED_LABEL

CHART_TEMPLATE = "charts/sandlot/templates/placement-policy.yaml"
RULE = "nodename-tolerates-taints"

_TOLERATES = (
    "(tol.?effect.orValue('') == '' || tol.effect == t.effect) && "
    "(tol.?operator.orValue('Equal') == 'Exists' ? "
    "(tol.?key.orValue('') == '' || tol.key == t.key) : "
    "(tol.?key.orValue('') == t.key && tol.?value.orValue('') == t.?value.orValue('')))"
)
"""CEL: toleration ``tol`` matches taint ``t`` (``sandlot.policy.placement.tolerates``)."""

_TAINT_TEXT = "t.key + (t.?value.orValue('') == '' ? '' : '=' + t.value) + ':' + t.effect"


def _metadata(name: str) -> dict[str, Any]:
    return {"name": name, "labels": {APP_NAME_LABEL: APP_NAME}}


def placement_policy(fullname: str) -> list[dict[str, Any]]:
    """The policy and its binding (``fullname``: the release's name prefix)."""
    name = f"{fullname}-placement"
    new_node = (
        "object.spec.?nodeName.orValue('') != '' && (oldObject == null || "
        "oldObject.spec.?nodeName.orValue('') != object.spec.nodeName)"
    )
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": _metadata(name),
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SandboxNode"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["sandboxes"],
                    }
                ]
            },
            "matchConditions": [{"name": "sets-a-new-node-name", "expression": new_node}],
            "variables": [
                {
                    "name": "blocking",
                    "expression": "(params.?spec.?taints.orValue([]) + "
                    "params.?status.?trustedNodeTaints.orValue([]))"
                    ".filter(t, t.effect == 'NoSchedule' || t.effect == 'NoExecute')",
                },
                {
                    "name": "untolerated",
                    "expression": "variables.blocking.filter(t, "
                    f"!object.spec.?tolerations.orValue([]).exists(tol, {_TOLERATES}))",
                },
            ],
            "validations": [
                {
                    "expression": "params.metadata.name != object.spec.nodeName || "
                    "size(variables.untolerated) == 0",
                    "messageExpression": f"'{name}: rule {RULE}: spec.nodeName is ' + "
                    "object.spec.nodeName + ', whose taints this sandbox does not tolerate: {' "
                    f"+ variables.untolerated.map(t, {_TAINT_TEXT}).join(', ') + '}}; add "
                    "tolerations, or leave spec.nodeName to the scheduler'",
                    "reason": "Forbidden",
                }
            ],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": _metadata(name),
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "paramRef": {
                "selector": {"matchLabels": {TAINTED_LABEL: "true"}},
                "parameterNotFoundAction": "Allow",
            },
        },
    }
    return [policy, binding]


_FULLNAME = "@@FULLNAME@@"


def chart_template() -> str:
    """The chart's ``templates/placement-policy.yaml``."""
    body = "---\n".join(
        yaml.safe_dump(obj, sort_keys=False, width=1000) for obj in placement_policy(_FULLNAME)
    )
    return (
        "# Generated by `sandlot gen admission` from sandlot/api/placementpolicy.py; "
        "do not edit.\n"
        "{{- if .Values.placementPolicy.enabled }}\n"
        '{{- $fullname := include "sandlot.fullname" . }}\n'
        f"{body.replace(_FULLNAME, '{{ $fullname }}')}"
        "{{- end }}\n"
    )


__all__ = ["CHART_TEMPLATE", "RULE", "chart_template", "placement_policy"]
