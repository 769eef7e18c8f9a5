"""A sandbox's network policy (``spec.networkPolicy``), shaped like Kubernetes'
NetworkPolicy: sandboxes are not pods, so no NetworkPolicy engine ever sees them and
sandlot enforces its own (``sandlot.policy.netpolicy`` renders it, the agent installs
it in the sandbox's network namespace before its process starts).

What is not written falls back: a missing ``ingress`` or ``egress`` takes the
namespace's default (annotation ``sandlot.dev/default-network-policy``), then none;
the cluster default (the agent's settings) always stands above: replies and the
node's own traffic in; link-local, CGNAT, the node's addresses, the cluster's ranges
and RFC 1918 out only where the cluster's ``allowedEgress`` opens them. A tenant's
egress rules only narrow what the cluster allows (docs/isolation.md).
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from sandlot.api.common import MAX_DNS_LABEL, MAX_ENTRIES, Model, PortNumber

MAX_RULES = 32
MAX_PEERS = 32

LabelValue = Annotated[str, Field(max_length=MAX_DNS_LABEL)]
Cidr = Annotated[
    str,
    Field(
        max_length=64,
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "isCIDR(self)", "message": "must be a CIDR such as 10.0.0.0/8"}
            ]
        },
    ),
]


def parse_cidr(text: str, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A CIDR, refused naming ``where`` when it is not one or has host bits set."""
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ValueError(f"{where}: {text!r} is not a CIDR such as 10.0.0.0/8 ({exc})") from None


class LabelSelectorRequirement(Model):
    key: str = Field(min_length=1, max_length=317, description="Label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the label's value is compared with values."
    )
    values: list[LabelValue] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="Values for In and NotIn."
    )

    @model_validator(mode="after")
    def _values_fit(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"matchExpressions: {self.operator} on {self.key} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"matchExpressions: {self.operator} on {self.key} takes no values")
        return self


class LabelSelector(Model):
    """Sandboxes by their labels, as a NetworkPolicy's podSelector (empty: every one)."""

    match_labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        json_schema_extra={"maxProperties": MAX_ENTRIES},
        description="Labels a sandbox must carry, with these values.",
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="All must hold."
    )


class IpBlock(Model):
    cidr: Cidr = Field(description="A range, such as 203.0.113.0/24.")
    except_: list[Cidr] = Field(
        default_factory=list,
        alias="except",
        max_length=MAX_ENTRIES,
        description="Ranges inside cidr left out.",
    )

    @model_validator(mode="after")
    def _cidrs(self) -> IpBlock:
        outer = parse_cidr(self.cidr, "ipBlock.cidr")
        for i, text in enumerate(self.except_):
            inner = parse_cidr(text, f"ipBlock.except[{i}]")
            if inner.version != outer.version or not inner.subnet_of(outer):  # type: ignore[arg-type]
                raise ValueError(f"ipBlock.except[{i}]: {text} is not inside {self.cidr}")
        return self


class PolicyPort(Model):
    protocol: Literal["TCP", "UDP"] = Field(default="TCP", description="TCP or UDP.")
    port: PortNumber | None = Field(default=None, description="Port number; empty: every port.")


_ONE_PEER: JsonDict = {
    "x-kubernetes-validations": [
        {
            "rule": "has(self.sandboxSelector) != has(self.ipBlock)",
            "message": "ingress from: set exactly one of sandboxSelector and ipBlock",
            "reason": "FieldValueInvalid",
        }
    ]
}


class IngressPeer(Model):
    """Exactly one of sandboxSelector (sandboxes of the same namespace) and ipBlock."""

    model_config = ConfigDict(json_schema_extra=_ONE_PEER)  # merged with Model's

    sandbox_selector: LabelSelector | None = Field(
        default=None, description="Sandboxes of this namespace whose labels match."
    )
    ip_block: IpBlock | None = Field(default=None, description="Sources in this range.")

    @model_validator(mode="after")
    def _one(self) -> IngressPeer:
        if (self.sandbox_selector is None) == (self.ip_block is None):
            raise ValueError("ingress from: set exactly one of sandboxSelector and ipBlock")
        return self


class EgressPeer(Model):
    ip_block: IpBlock = Field(description="Destinations in this range.")


class IngressRule(Model):
    from_: list[IngressPeer] = Field(
        default_factory=list,
        alias="from",
        max_length=MAX_PEERS,
        description="Sources allowed; empty: any source.",
    )
    ports: list[PolicyPort] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="Ports; empty: every port."
    )


class EgressRule(Model):
    to: list[EgressPeer] = Field(
        default_factory=list,
        max_length=MAX_PEERS,
        description="Destinations allowed (within what the cluster allows); empty: any.",
    )
    ports: list[PolicyPort] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="Ports; empty: every port."
    )


class SandboxNetworkPolicy(Model):
    """Traffic a sandbox accepts and sends beyond the cluster default."""

    ingress: list[IngressRule] | None = Field(
        default=None,
        max_length=MAX_RULES,
        description="Connections accepted besides the node's own (probes) and replies. "
        "Unset: the namespace default's; unset there too: the ports the sandbox "
        "publishes (spec.ports, its pool Service's) from anywhere.",
    )
    egress: list[EgressRule] | None = Field(
        default=None,
        max_length=MAX_RULES,
        description="Where connections may go out: set, only where a rule allows, and "
        "never into what the cluster blocks (link-local and metadata, CGNAT, the node's "
        "addresses, the cluster's ranges, RFC 1918), which only the cluster's "
        "allowedEgress opens. Unset: the namespace default's; unset there too: "
        "wherever the cluster allows.",
    )


__all__ = [
    "EgressPeer",
    "EgressRule",
    "IngressPeer",
    "IngressRule",
    "IpBlock",
    "LabelSelector",
    "LabelSelectorRequirement",
    "PolicyPort",
    "SandboxNetworkPolicy",
    "parse_cidr",
]
