"""Pieces shared by every kind: the API group, the model base, conditions, and
the CRD metadata each kind declares next to its fields."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "sandlot.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The kinds' resource names (plurals), as API paths, RBAC rules and watches name them.
SANDBOXES = "sandboxes"
NODES = "sandboxnodes"
POOLS = "sandboxpools"
CLAIMS = "sandboxclaims"
CACHEPRUNES = "cacheprunes"
SNAPSHOTS = "sandboxsnapshots"
KUBE_NODES = "nodes"  # the Kubernetes Nodes (core API group), watched by the scheduler

# Size limits on every string, list and map of the CRDs: bad input fails closed at
# the API server, cheaply, and CEL rules get a bounded cost. Kubernetes' own limits
# where it has one (names, metav1.Condition).
MAX_NAME = 253
"""An object or node name (a DNS subdomain)."""
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""An RFC 1123 subdomain, as Kubernetes names a Node or a RuntimeClass."""
MAX_DNS_LABEL = 63
MAX_WORD = 1024
"""A CamelCase reason, a condition type, a capability name, a short token."""
MAX_MESSAGE = 32768
"""A human-readable message (metav1.Condition's limit)."""
MAX_IMAGE = 1024
"""An image reference."""
MAX_ARG = 16384
"""One argument of a command line."""
MAX_ARGS = 256
MAX_ENV = 256
MAX_ENV_VALUE = 32768
MAX_PORTS = 64
MAX_CAPABILITIES = 64
MAX_CONDITIONS = 32
MAX_NODES = 5000
"""Nodes named in one object (a CachePrune's targets and results)."""
MAX_ENTRIES = 64
"""Entries of a map (labels, annotations) or a list of scheduling terms."""
MAX_QUANTITY = 64


def key_of(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a namespaced object, ``name`` of a cluster-scoped one:
    the one key every cache, queue and log line of sandlot uses for an object."""
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def join_key(namespace: str, name: str) -> str:
    """``namespace/name``: the key ``key_of`` gives an object of that namespace and
    name, for a place that holds the two apart (a record, a request, a reference)."""
    return f"{namespace}/{name}"


def split_key(key: str) -> tuple[str, str]:
    """``(namespace, name)`` of a namespaced object's key: the inverse of ``key_of``.
    A key without a namespace is refused (ValueError), not read as a name."""
    namespace, slash, name = key.partition("/")
    if not slash:
        raise ValueError(f"not a namespace/name key: {key!r}")
    return namespace, name


def controller_reference(
    api_version: str, kind: str, name: str, uid: str, *, block_owner_deletion: bool
) -> dict[str, Any]:
    """An ownerReference naming its owner as the controller: the owned object goes with
    it; ``block_owner_deletion``: a foreground deletion of the owner waits for it."""
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": block_owner_deletion,
    }


def cel_list(words: Iterable[str]) -> str:
    """A CEL list literal of ``words`` (enum members: the rule follows the enum)."""
    return "[" + ", ".join(f"'{w}'" for w in words) + "]"


class Model(BaseModel):
    """Base of every API model: camelCase on the wire, unknown fields kept out."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_enum_values=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class Condition(Model):
    """A Kubernetes-style condition (same shape as metav1.Condition)."""

    type: str = Field(
        max_length=316, description="Type of the condition, in CamelCase (for example `Ready`)."
    )
    status: Literal["True", "False", "Unknown"] = Field(
        description="Status of the condition: True, False or Unknown."
    )
    reason: str = Field(
        default="",
        max_length=MAX_WORD,
        description="One CamelCase word saying why the condition is as it is.",
    )
    message: str = Field(
        default="", max_length=MAX_MESSAGE, description="A human-readable explanation."
    )
    last_transition_time: datetime | None = Field(
        default=None, description="When the condition last changed status (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None,
        ge=0,
        description="The object's metadata.generation the condition was set from.",
    )


PortNumber = Annotated[int, Field(ge=1, le=65535)]
"""A TCP or UDP port number in a sandbox."""

Conditions = Annotated[list[Condition], Field(max_length=MAX_CONDITIONS)]
"""An object's conditions, one per type, merged as ``meta.SetStatusCondition`` does."""


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    priority: int = 0
    description: str = ""


AGE_COLUMN = PrinterColumn("Age", ".metadata.creationTimestamp", "date")
"""kubectl's AGE column, as every kind prints it."""


@dataclass(frozen=True)
class CrdInfo:
    """What a kind declares about itself beyond its fields."""

    kind: str
    plural: str
    scope: Literal["Namespaced", "Cluster"]
    short_names: tuple[str, ...] = ()
    columns: tuple[PrinterColumn, ...] = ()
    selectable_fields: tuple[str, ...] = ()
    scale: dict[str, str] | None = None
    categories: tuple[str, ...] = ("sandlot",)
    # CEL rules (x-kubernetes-validations) keyed by the top-level property they sit on.
    validations: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    # Another API's kinds served by sandlot (sandlot.api.agentsandbox) name their own.
    group: str = GROUP
    version: str = VERSION

    @property
    def singular(self) -> str:
        """The kind in lower case, as the API server defaults it."""
        return self.kind.lower()


class Resource(Model):
    """A top-level kind: apiVersion, kind, metadata, spec, status."""

    crd: ClassVar[CrdInfo]

    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
