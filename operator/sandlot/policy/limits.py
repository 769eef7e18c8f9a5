"""The limits every sandbox runs with: its own, else its namespace's defaults, else
the agent's. Pure.

A sandbox without a memory, CPU or pids limit is a tenant that can take the whole
node; so every sandbox gets all three. The agent's settings give the defaults; a
namespace may set its own with the annotation
``sandlot.dev/default-limits: memory=512Mi,cpu=500m,pids=256`` (any subset), and a
Sandbox's ``spec.resources.limits`` wins over both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sandlot.api.sandbox import ResourceLimits, SandboxSpec
from sandlot.policy.quantity import parse_quantity

_KEYS = ("memory", "cpu", "pids")


@dataclass(frozen=True)
class DefaultLimits:
    memory: str = ""
    """A memory quantity ("" = none)."""
    cpu: str = ""
    """A CPU quantity ("" = none)."""
    pids: int | None = None
    """Most processes; None = none."""


def parse_defaults(text: str) -> DefaultLimits:
    """``memory=512Mi,cpu=500m,pids=256`` (any subset, any order); ``ValueError``
    naming the bad part otherwise."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in _KEYS or not value:
            raise ValueError(f"{part!r} is not one of memory=Q, cpu=Q, pids=N")
        if key == "pids":
            if not value.isdigit():
                raise ValueError(f"pids={value!r} is not a whole number")
        elif parse_quantity(value) <= 0:
            raise ValueError(f"{key}={value!r} is not a positive quantity")
        values[key] = value
    return DefaultLimits(
        memory=values.get("memory", ""),
        cpu=values.get("cpu", ""),
        pids=int(values["pids"]) if "pids" in values else None,
    )


def merge(base: DefaultLimits, override: DefaultLimits) -> DefaultLimits:
    """``override``'s values where it has them, else ``base``'s."""
    return replace(
        base,
        memory=override.memory or base.memory,
        cpu=override.cpu or base.cpu,
        pids=override.pids if override.pids is not None else base.pids,
    )


def with_defaults(spec: SandboxSpec, defaults: DefaultLimits) -> SandboxSpec:
    """``spec`` with every limit it lacks filled from ``defaults``."""
    own = spec.resources.limits if spec.resources else ResourceLimits()
    limits = {
        "memory": own.memory or defaults.memory or None,
        "cpu": own.cpu or defaults.cpu or None,
    }
    body = spec.model_dump(by_alias=True, exclude_none=True)
    body["resources"] = {"limits": {k: v for k, v in limits.items() if v}}
    return SandboxSpec.model_validate(body)


def pids_limit(defaults: DefaultLimits) -> int | None:
    """The pids limit of a sandbox (0 from a setting means none)."""
    return defaults.pids or None
