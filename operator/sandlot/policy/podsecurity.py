"""Does a Sandbox spec fit its namespace's policy level? Pure, and the agent's last word.

The API server refuses a violating Sandbox already (``sandlot.api.admission``
writes the same rules as a ValidatingAdmissionPolicy). The agent checks again,
with this module, right before it creates a container: a Sandbox stored while the
policy was absent, disabled or older than the agent still cannot escape. The
messages name the field and the namespace label that would allow it, like the
API server's.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandlot.api.admission import BASELINE_ADDABLE, Level, addable, cap_name
from sandlot.api.keys import LEVEL_LABEL
from sandlot.api.sandbox import SandboxSpec


@dataclass(frozen=True)
class Violation:
    field: str  # the spec field at fault, as the user writes it (spec.hostNetwork)
    message: str


def check(spec: SandboxSpec, level: Level, namespace: str = "") -> list[Violation]:
    """Every rule of ``level`` that ``spec`` breaks (empty: it may run)."""
    if level is Level.PRIVILEGED:
        return []
    where = f"namespace {namespace}" if namespace else "this namespace"
    at = f"in {where} (level {level.value})"

    def refused(field: str, allow_with: Level) -> Violation:
        return Violation(
            field,
            f"{field} is not allowed {at}: label the namespace "
            f"{LEVEL_LABEL}={allow_with.value} to allow it",
        )

    found: list[Violation] = []
    ctx = spec.security_context
    if ctx is not None and ctx.privileged:
        found.append(refused("spec.securityContext.privileged", Level.PRIVILEGED))
    if spec.host_network:
        found.append(refused("spec.hostNetwork", Level.PRIVILEGED))
    allowed = addable(level) or ()
    adds = list(ctx.capabilities.add) if ctx is not None and ctx.capabilities else []
    extra = [c for c in adds if cap_name(c) not in allowed]
    if extra:
        wider = Level.BASELINE if all(cap_name(c) in BASELINE_ADDABLE for c in extra) else None
        found.append(
            Violation(
                "spec.securityContext.capabilities.add",
                f"spec.securityContext.capabilities.add: {', '.join(extra)} not allowed {at}: "
                f"label the namespace {LEVEL_LABEL}={(wider or Level.PRIVILEGED).value} "
                "to allow them",
            )
        )
    if level is Level.RESTRICTED:
        if ctx is None or not ctx.run_as_non_root:
            found.append(
                Violation(
                    "spec.securityContext.runAsNonRoot",
                    f"spec.securityContext.runAsNonRoot must be true {at}: set it, or label "
                    f"the namespace {LEVEL_LABEL}={Level.BASELINE.value}",
                )
            )
        if ctx is not None and ctx.run_as_user == 0:
            found.append(
                Violation(
                    "spec.securityContext.runAsUser",
                    f"spec.securityContext.runAsUser: 0 is not allowed {at}: label the "
                    f"namespace {LEVEL_LABEL}={Level.BASELINE.value} to allow it",
                )
            )
    return found


def describe(violations: list[Violation]) -> str:
    """One message for a sandbox's status: every violation, field first."""
    return "; ".join(v.message for v in violations)
