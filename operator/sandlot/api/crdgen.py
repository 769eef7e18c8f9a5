"""Turns the pydantic models into CustomResourceDefinitions.

The models are the single source of truth; this module renders them to
structural openAPIV3Schema (no ``$ref``, a type on every node, ``nullable``
instead of ``anyOf: [X, null]``) plus the CRD-level parts each kind declares in
its ``CrdInfo``. It is pure: ``render_crds`` returns file names and YAML text,
and ``sandlot gen crds`` writes them.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

import yaml

from sandlot.api.cacheprune import CachePrune
from sandlot.api.claim import SandboxClaim
from sandlot.api.common import Resource
from sandlot.api.node import SandboxNode
from sandlot.api.pool import SandboxPool
from sandlot.api.sandbox import Sandbox
from sandlot.api.snapshot import SandboxSnapshot

KINDS: tuple[type[Resource], ...] = (
    Sandbox,
    SandboxNode,
    SandboxPool,
    CachePrune,
    SandboxClaim,
    SandboxSnapshot,
)

# Where generated CRDs go, relative to the repository root.
CRD_DIRS = ("crds", "charts/sandlot/crds")

_DROP_KEYS = {"title"}
INT_OR_STRING = "x-kubernetes-int-or-string"


class SchemaError(ValueError):
    pass


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Inline $refs, collapse Optional, and drop what CRD schemas do not allow."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        ref = node.pop("$ref").rsplit("/", 1)[-1]
        merged = copy.deepcopy(defs[ref])
        merged.update(node)  # description / default at the use site win
        node = merged
    if node.get(INT_OR_STRING):
        # Kubernetes' int-or-string (maxSurge: 1 or "25%"): no type, the marker instead.
        node.pop("anyOf", None)
        return {k: v for k, v in node.items() if k not in _DROP_KEYS}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise SchemaError(f"union types are not structural: {options}")
        inner = _structural(options[0], defs)
        inner.update({k: v for k, v in node.items() if k not in _DROP_KEYS})
        node = inner
    if "enum" in node and "type" not in node:
        node["type"] = "string"
    if "const" in node:
        node["enum"] = [node.pop("const")]
        node.setdefault("type", "string")
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _structural(v, defs) for name, v in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _structural(value, defs)
        elif key == "additionalProperties" and value is True:
            continue  # dict[str, Any]: kept whole (preserve-unknown-fields, below)
        else:
            out[key] = value
    if out.get("default") is None:
        out.pop("default", None)
    if (
        out.get("type") == "object"
        and "properties" not in out
        and "additionalProperties" not in out
    ):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if "type" not in out:
        raise SchemaError(f"schema node has no type: {node}")
    return out


def _describe(kind: type[Resource]) -> str:
    """First paragraph of the kind's module docstring: what the kind is."""
    doc = sys.modules[kind.__module__].__doc__ or kind.crd.kind
    return " ".join(doc.strip().split("\n\n")[0].split())


def _schema_of(kind: type[Resource]) -> dict[str, Any]:
    raw = kind.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    props = raw["properties"]
    schema: dict[str, Any] = {
        "type": "object",
        "description": _describe(kind),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _structural(props["spec"], defs),
        },
    }
    if "spec" in raw.get("required", []):
        schema["required"] = ["spec"]
    status = _structural(props["status"], defs)
    status.pop("default", None)
    schema["properties"]["status"] = status
    for prop, rules in kind.crd.validations.items():
        # "": rules on the whole object (they may compare its spec with its status).
        target = schema if prop == "" else schema["properties"][prop]
        target["x-kubernetes-validations"] = rules
    # A missing spec behaves as the model's defaults (SandboxNode, CachePrune).
    if "spec" not in schema.get("required", []):
        schema["properties"]["spec"].setdefault("default", {})
    return schema


def crd_for(kind: type[Resource]) -> dict[str, Any]:
    info = kind.crd
    names: dict[str, Any] = {
        "kind": info.kind,
        "listKind": f"{info.kind}List",
        "plural": info.plural,
        "singular": info.singular,
        "categories": list(info.categories),
    }
    if info.short_names:
        names["shortNames"] = list(info.short_names)
    subresources: dict[str, Any] = {"status": {}}
    if info.scale:
        subresources["scale"] = dict(info.scale)
    version: dict[str, Any] = {
        "name": info.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": _schema_of(kind)},
        "subresources": subresources,
    }
    if info.columns:
        version["additionalPrinterColumns"] = [
            {
                "name": c.name,
                "type": c.type,
                "jsonPath": c.json_path,
                **({"priority": c.priority} if c.priority else {}),
                **({"description": c.description} if c.description else {}),
            }
            for c in info.columns
        ]
    if info.selectable_fields:
        version["selectableFields"] = [{"jsonPath": p} for p in info.selectable_fields]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{info.plural}.{info.group}"},
        "spec": {
            "group": info.group,
            "names": names,
            "scope": info.scope,
            "versions": [version],
        },
    }


HEADER = "# Generated from sandlot.api by `sandlot gen crds`. Do not edit.\n"


def render_crds(kinds: tuple[type[Resource], ...] = KINDS) -> dict[str, str]:
    """File name -> YAML text, one file per kind."""
    return {
        f"{kind.crd.group}_{kind.crd.plural}.yaml": HEADER
        + yaml.safe_dump(crd_for(kind), sort_keys=False, width=100)
        for kind in kinds
    }


# agent-sandbox's kinds (sandlot.api.agentsandbox): apart from sandlot's own, never in
# the chart's crds/ (which Helm installs whatever the values), but in a template the
# chart renders only under agentSandbox.enabled, refusing CRDs another owner installed.
AGENT_SANDBOX_CRD_DIR = "crds/agent-sandbox"
AGENT_SANDBOX_CHART_TEMPLATE = "charts/sandlot/templates/agent-sandbox-crds.yaml"


def render_agent_sandbox_crds() -> dict[str, str]:
    from sandlot.api.agentsandbox import AGENT_SANDBOX_KINDS

    return render_crds(AGENT_SANDBOX_KINDS)


def agent_sandbox_chart_template() -> str:
    """The chart's template of agent-sandbox's CRDs: rendered only when enabled, and
    failing the install when a CRD of that name exists and is not this release's
    (agent-sandbox's own controller installed it: two controllers would fight)."""
    from sandlot.api.agentsandbox import AGENT_SANDBOX_KINDS

    names = [f"{k.crd.plural}.{k.crd.group}" for k in AGENT_SANDBOX_KINDS]
    guard = (
        "{{- if .Values.agentSandbox.enabled }}\n"
        "{{- range $name := list " + " ".join(f'"{n}"' for n in names) + " }}\n"
        '{{- $found := lookup "apiextensions.k8s.io/v1" "CustomResourceDefinition" "" $name }}\n'
        "{{- if $found }}\n"
        '{{- $owner := index ($found.metadata.annotations | default dict) "meta.helm.sh/release-name" }}\n'
        '{{- if ne ($owner | default "") $.Release.Name }}\n'
        '{{- fail (printf "agentSandbox.enabled: CustomResourceDefinition %s exists and is not '
        "this release's (another owner, such as agent-sandbox's own controller, installed it); "
        'remove it first or leave agentSandbox.enabled false" $name) }}\n'
        "{{- end }}\n{{- end }}\n{{- end }}\n"
    )
    docs = []
    for kind in AGENT_SANDBOX_KINDS:
        crd = crd_for(kind)
        crd["metadata"]["labels"] = {"app.kubernetes.io/part-of": "sandlot"}
        # Kept by `helm uninstall`, as sandlot's own CRDs are: their objects are users'.
        crd["metadata"]["annotations"] = {"helm.sh/resource-policy": "keep"}
        docs.append("---\n" + yaml.safe_dump(crd, sort_keys=False, width=100))
    return "# " + HEADER[2:] + guard + "".join(docs) + "{{- end }}\n"
