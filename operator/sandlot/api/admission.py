"""Sandbox policy levels, and the API server's enforcement of them as CEL.

The levels follow Kubernetes' Pod Security Standards, cut down to the fields a
Sandbox has:

- ``privileged``: anything goes (the sandbox may own the node).
- ``baseline`` (the default): no ``privileged``, no ``hostNetwork``, and
  ``capabilities.add`` only from PSS baseline's list (Docker's default set minus
  ``NET_RAW``).
- ``restricted``: baseline, plus ``runAsNonRoot: true``, no ``runAsUser: 0``, and
  only ``NET_BIND_SERVICE`` may be added.

A namespace picks its level with the label ``sandlot.dev/enforce``, like Pod
Security admission's ``pod-security.kubernetes.io/enforce``; a label value that
names no level counts as ``restricted`` (a typo never widens anything).

This module is the one source of those rules as data. ``sandlot.policy.podsecurity``
evaluates them in Python (the agent checks again before it creates a container);
``admission_policy()`` writes them as a ``ValidatingAdmissionPolicy`` and its
binding, so the API server refuses a Sandbox before anything stores it, with no
webhook to run. ``sandlot gen admission`` writes the chart's template from it, and
a test fails when the committed template has drifted.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import yaml

from sandlot.api.common import cel_list
from sandlot.api.keys import APP_NAME, APP_NAME_LABEL, LEVEL_LABEL

POLICY_NAME = "sandlot-sandbox-security"
CHART_TEMPLATE = "charts/sandlot/templates/admission-policy.yaml"


class Level(StrEnum):
    PRIVILEGED = "privileged"
    BASELINE = "baseline"
    RESTRICTED = "restricted"


DEFAULT_LEVEL = Level.BASELINE
# A label naming no level is read as this one: a typo must never widen anything.
UNKNOWN_LEVEL = Level.RESTRICTED

# Capabilities a ``baseline`` namespace may add: Pod Security Standards' baseline
# list (Docker's and containerd's default set, minus NET_RAW). Names without CAP_.
BASELINE_ADDABLE = (
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
)
# The only capability a ``restricted`` namespace may add (as in PSS restricted).
RESTRICTED_ADDABLE = ("NET_BIND_SERVICE",)


def cap_name(name: str) -> str:
    """``CAP_NET_ADMIN`` and ``NET_ADMIN`` are the same capability: the short form."""
    upper = name.upper()
    return upper[4:] if upper.startswith("CAP_") else upper


def addable(level: Level) -> tuple[str, ...] | None:
    """Capabilities ``level`` lets a sandbox add; None means any."""
    if level is Level.PRIVILEGED:
        return None
    return RESTRICTED_ADDABLE if level is Level.RESTRICTED else BASELINE_ADDABLE


def level_of(labels: dict[str, str] | None, default: Level = DEFAULT_LEVEL) -> Level:
    """The level a namespace's labels select (``default`` without the label)."""
    value = (labels or {}).get(LEVEL_LABEL)
    if value is None:
        return default
    try:
        return Level(value)
    except ValueError:
        return UNKNOWN_LEVEL


# ------------------------------------------------------------------------ CEL


def _cel_list(items: tuple[str, ...]) -> str:
    # Both spellings, so `CAP_CHOWN` and `chown`-style typos are judged like the agent does.
    names = sorted({*items, *(f"CAP_{c}" for c in items)})
    return "[" + ", ".join(f"'{n}'" for n in names) + "]"


def _refusal(field: str, level: str) -> str:
    return (
        f"'{field} is not allowed in namespace ' + namespaceObject.metadata.name + ' (level ' "
        f"+ variables.level + '): label the namespace {LEVEL_LABEL}={level} to allow it'"
    )


_SECURITY_CONTEXT = "object.spec.?securityContext"


def _level_expression(default_level: str) -> str:
    """CEL for the namespace's level: its label when it names a level, the default
    without the label, the unknown level for any other value."""
    known = cel_list(Level)
    label = f"'{LEVEL_LABEL}'"
    return (
        f"!has(namespaceObject.metadata.labels) || !({label} in namespaceObject.metadata.labels)"
        f" ? '{default_level}'"
        f" : namespaceObject.metadata.labels[{label}] in {known}"
        f" ? namespaceObject.metadata.labels[{label}] : '{UNKNOWN_LEVEL.value}'"
    )


def _policy_variables(default_level: str) -> list[dict[str, str]]:
    """The level, the capabilities it allows, and the added ones it refuses."""
    adds = f"{_SECURITY_CONTEXT}.?capabilities.?add.orValue([])"
    return [
        {"name": "level", "expression": _level_expression(default_level)},
        {
            "name": "allowedCaps",
            "expression": f"variables.level == 'restricted' ? {_cel_list(RESTRICTED_ADDABLE)}"
            f" : {_cel_list(BASELINE_ADDABLE)}",
        },
        {
            "name": "refusedCaps",
            "expression": f"{adds}.filter(c, !(c.upperAscii() in variables.allowedCaps))",
        },
    ]


def _capabilities_message() -> str:
    """The refusal of added capabilities names the lowest level that allows them all."""
    return (
        "'spec.securityContext.capabilities.add: ' + variables.refusedCaps.join(', ') + "
        "' not allowed in namespace ' + namespaceObject.metadata.name + ' (level ' + "
        "variables.level + '): label the namespace "
        f"{LEVEL_LABEL}=' + "
        f"(variables.refusedCaps.all(c, c.upperAscii() in {_cel_list(BASELINE_ADDABLE)}) "
        "? 'baseline' : 'privileged') + "
        "' to allow them'"
    )


def _policy_validations() -> list[dict[str, str]]:
    """One validation per rule of the levels, each with a message naming the fix."""
    sc = _SECURITY_CONTEXT
    return [
        {
            "expression": f"variables.level == 'privileged' || !{sc}.?privileged.orValue(false)",
            "messageExpression": _refusal("spec.securityContext.privileged", "privileged"),
            "reason": "Forbidden",
        },
        {
            "expression": "variables.level == 'privileged' || "
            "!object.spec.?hostNetwork.orValue(false)",
            "messageExpression": _refusal("spec.hostNetwork", "privileged"),
            "reason": "Forbidden",
        },
        {
            "expression": "variables.level == 'privileged' || size(variables.refusedCaps) == 0",
            "messageExpression": _capabilities_message(),
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.level != 'restricted' || {sc}.?runAsNonRoot.orValue(false)",
            "messageExpression": "'spec.securityContext.runAsNonRoot must be true in "
            "namespace ' + namespaceObject.metadata.name + ' (level restricted): set "
            f"it, or label the namespace {LEVEL_LABEL}=baseline'",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.level != 'restricted' || {sc}.?runAsUser.orValue(1) != 0",
            "messageExpression": "'spec.securityContext.runAsUser: 0 is not allowed "
            "in namespace ' + namespaceObject.metadata.name + ' (level restricted): "
            f"label the namespace {LEVEL_LABEL}=baseline to allow it'",
            "reason": "Forbidden",
        },
    ]


def admission_policy(default_level: str = DEFAULT_LEVEL.value) -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding, as plain objects.

    ``default_level`` is the level of a namespace without the label; it is spliced
    into a CEL string literal, so only a level name is accepted (the chart template
    substitutes its value at the same place, see ``chart_template``).
    """
    if default_level != _TEMPLATE_LEVEL:
        Level(default_level)
    policy: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME, "labels": {APP_NAME_LABEL: APP_NAME}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": ["sandlot.dev"],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": ["sandboxes"],
                    }
                ]
            },
            # Updates that leave the spec alone (finalizers, labels) pass even in a
            # namespace whose level was lowered after the sandbox was admitted.
            "matchConditions": [
                {
                    "name": "spec-is-new-or-changed",
                    "expression": "request.operation == 'CREATE' || oldObject.spec != object.spec",
                }
            ],
            "variables": _policy_variables(default_level),
            "validations": _policy_validations(),
        },
    }
    binding: dict[str, Any] = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME, "labels": {APP_NAME_LABEL: APP_NAME}},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]


_TEMPLATE_LEVEL = "@@DEFAULT_LEVEL@@"


def chart_template() -> str:
    """The chart's ``templates/admission-policy.yaml``: the same objects, Helm-guarded.

    The default level comes from ``.Values.admissionPolicy.defaultLevel`` and is
    checked against the level names before it reaches a CEL literal.
    """
    body = "---\n".join(
        yaml.safe_dump(obj, sort_keys=False, width=1000)
        for obj in admission_policy(_TEMPLATE_LEVEL)
    )
    body = body.replace(_TEMPLATE_LEVEL, "{{ $level }}")
    levels = " ".join(f'"{lv.value}"' for lv in Level)
    return (
        "# Generated by `sandlot gen admission` from sandlot/api/admission.py; do not edit.\n"
        "{{- if .Values.admissionPolicy.enabled }}\n"
        "{{- $level := .Values.admissionPolicy.defaultLevel | default "
        f'"{DEFAULT_LEVEL.value}" }}}}\n'
        f"{{{{- if not (has $level (list {levels})) }}}}\n"
        '{{- fail (printf "admissionPolicy.defaultLevel must be one of '
        f'{", ".join(lv.value for lv in Level)}, not %q" $level) }}}}\n'
        "{{- end }}\n"
        f"{body}"
        "{{- end }}\n"
    )
