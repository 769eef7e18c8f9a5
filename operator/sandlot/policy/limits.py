"""The limits every sandbox runs with: its own, else its namespace's defaults, else
the agent's. Pure.

A sandbox without a memory, CPU or pids limit is a tenant that can take the whole
node; so every sandbox gets all three. The agent's settings give the defaults; a
namespace may set its own with the annotation
``sandlot.dev/default-limits: memory=512Mi,cpu=500m,pids=256`` (any subset, and
``ephemeralStorage=1Gi``, which has no node-wide default), and a Sandbox's
``spec.resources.limits`` wins over both.

A limit below its floor is refused wherever it comes from (the CRD's CEL at
admission, the settings at start-up, the annotation and the Sandbox again here),
never read as "none": runc takes a memory limit of 0 for no limit, and a pids
limit of 0 used to mean none too. The check here is the one that holds for
objects written before the CRD had the rule.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import (
    MIN_CPU_LIMIT,
    MIN_EPHEMERAL_STORAGE_LIMIT,
    MIN_MEMORY_LIMIT,
    ResourceLimits,
    SandboxSpec,
)
from sandlot.policy.quantity import parse_quantity

_KEYS = ("memory", "cpu", "pids", "ephemeralStorage")

MIN_PIDS_LIMIT = 8
"""The fewest processes (and threads) a sandbox may be limited to: a shell and a
pipeline need a few."""
PIDS_RESERVE = 4096
"""PIDs the parent cgroup of all sandboxes leaves to the node's own services."""


class LimitRefused(ValueError):
    """A limit below its floor, or none at all; the message names where it came from."""

    reason = SandboxReason.LIMIT_REFUSED


def memory_floor_refusal(value: str, where: str) -> str | None:
    """Why ``value`` (a memory quantity) is no limit, naming ``where``; None if it is one."""
    if parse_quantity(value) < parse_quantity(MIN_MEMORY_LIMIT):
        return (
            f"{where} {value!r} is below the floor of {MIN_MEMORY_LIMIT} "
            "(a memory limit of 0 would mean none)"
        )
    return None


def cpu_floor_refusal(value: str, where: str) -> str | None:
    """Why ``value`` (a CPU quantity) is no limit, naming ``where``; None if it is one."""
    if parse_quantity(value) < parse_quantity(MIN_CPU_LIMIT):
        return f"{where} {value!r} is below the floor of {MIN_CPU_LIMIT}"
    return None


def storage_floor_refusal(value: str, where: str) -> str | None:
    """Why ``value`` (a disk quantity) is no limit, naming ``where``; None if it is one."""
    if parse_quantity(value) < parse_quantity(MIN_EPHEMERAL_STORAGE_LIMIT):
        return f"{where} {value!r} is below the floor of {MIN_EPHEMERAL_STORAGE_LIMIT}"
    return None


_FLOORS = {
    "memory": memory_floor_refusal,
    "cpu": cpu_floor_refusal,
    "ephemeralStorage": storage_floor_refusal,
}


def defaults_refusal(memory: str, cpu: str) -> str | None:
    """Why the agent's default memory or CPU limit is none, naming its setting."""
    for name, value, floor in (
        ("default_memory_limit", memory, memory_floor_refusal),
        ("default_cpu_limit", cpu, cpu_floor_refusal),
    ):
        if not value:
            return f"{name} is empty: every sandbox needs a limit"
        refusal = floor(value, name)
        if refusal:
            return refusal
    return None


def pids_floor_refusal(value: int, where: str) -> str | None:
    """Why ``value`` is no pids limit, naming ``where``; None if it is one."""
    if value < MIN_PIDS_LIMIT:
        return f"{where} {value} is below the floor of {MIN_PIDS_LIMIT} (0 would mean none)"
    return None


@dataclass(frozen=True)
class DefaultLimits:
    memory: str = ""
    """A memory quantity ("" = none)."""
    cpu: str = ""
    """A CPU quantity ("" = none)."""
    pids: int | None = None
    """Most processes; None = none."""
    ephemeral_storage: str = ""
    """A disk quantity: writable layer and logs ("" = not measured)."""


def parse_defaults(text: str) -> DefaultLimits:
    """``memory=512Mi,cpu=500m,pids=256,ephemeralStorage=1Gi`` (any subset, any
    order); ``ValueError`` naming the bad part otherwise."""
    values: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in _KEYS or not value:
            raise ValueError(f"{part!r} is not one of memory=Q, cpu=Q, pids=N, ephemeralStorage=Q")
        if key == "pids":
            if not value.isdigit():
                raise ValueError(f"pids={value!r} is not a whole number")
            refusal = pids_floor_refusal(int(value), "pids")
        elif parse_quantity(value) <= 0:
            raise ValueError(f"{key}={value!r} is not a positive quantity")
        else:
            refusal = _FLOORS[key](value, key)
        if refusal:
            raise ValueError(refusal)
        values[key] = value
    return DefaultLimits(
        memory=values.get("memory", ""),
        cpu=values.get("cpu", ""),
        pids=int(values["pids"]) if "pids" in values else None,
        ephemeral_storage=values.get("ephemeralStorage", ""),
    )


def merge(base: DefaultLimits, override: DefaultLimits) -> DefaultLimits:
    """``override``'s values where it has them, else ``base``'s."""
    return replace(
        base,
        memory=override.memory or base.memory,
        cpu=override.cpu or base.cpu,
        pids=override.pids if override.pids is not None else base.pids,
        ephemeral_storage=override.ephemeral_storage or base.ephemeral_storage,
    )


def with_defaults(spec: SandboxSpec, defaults: DefaultLimits) -> SandboxSpec:
    """``spec`` with every limit it lacks filled from ``defaults``."""
    own = spec.resources.limits if spec.resources else ResourceLimits()
    limits = {
        "memory": own.memory or defaults.memory or None,
        "cpu": own.cpu or defaults.cpu or None,
        "ephemeralStorage": own.ephemeral_storage or defaults.ephemeral_storage or None,
    }
    body = spec.model_dump(by_alias=True, exclude_none=True)
    body["resources"] = {"limits": {k: v for k, v in limits.items() if v}}
    return SandboxSpec.model_validate(body)


def pids_limit(defaults: DefaultLimits) -> int:
    """The pids limit of a sandbox; ``LimitRefused`` when there is none or it is below
    the floor (the agent's settings refuse both, so only a caller's bug gets here)."""
    if defaults.pids is None:
        raise LimitRefused("no pids limit applies (the agent's pidsLimit is unset)")
    refusal = pids_floor_refusal(defaults.pids, "the pids limit")
    if refusal:
        raise LimitRefused(refusal)
    return defaults.pids


def check_limits(spec: SandboxSpec, pids: int | None, *, required: bool = True) -> None:
    """Refuse (``LimitRefused``, naming the field) a limit below its floor; with
    ``required``, also a spec that lacks a memory, CPU or pids limit (after
    ``with_defaults``, a sandbox always has those three; a disk limit is optional)."""
    own = spec.resources.limits if spec.resources else ResourceLimits()
    for field, value in (
        ("memory", own.memory),
        ("cpu", own.cpu),
        ("ephemeralStorage", own.ephemeral_storage),
    ):
        where = f"spec.resources.limits.{field}"
        if value:
            refusal = _FLOORS[field](value, where)
            if refusal:
                raise LimitRefused(refusal)
        elif required and field != "ephemeralStorage":
            raise LimitRefused(f"{where} is unset and no default applies")
    if pids is not None:
        refusal = pids_floor_refusal(pids, "the pids limit")
        if refusal:
            raise LimitRefused(refusal)
    elif required:
        raise LimitRefused("no pids limit applies")


@dataclass(frozen=True)
class ParentLimits:
    """Hard limits of the parent cgroup of every sandbox: the sum of all tenants."""

    memory: int
    """Bytes."""
    pids: int


def parent_limits(
    node_memory: int, memory_reserve: int, pid_max: int, pids_reserve: int = PIDS_RESERVE
) -> ParentLimits:
    """What the node has minus what its own services (kubelet, containerd, the agent)
    keep, so no sum of sandboxes can take it from them; never below one sandbox's
    floor (a node with nothing to spare then runs next to nothing, rather than no
    limit)."""
    floor = int(parse_quantity(MIN_MEMORY_LIMIT))
    return ParentLimits(
        memory=max(node_memory - memory_reserve, floor),
        pids=max(pid_max - pids_reserve, MIN_PIDS_LIMIT),
    )
