"""A Sandbox against its namespace's rules, read when it starts: the policy level
(``sandlot.dev/enforce``) and the default limits (``sandlot.dev/default-limits``),
which with the agent's own make every sandbox's limits finite.

Defence in depth behind the admission policy, and the one place a namespace's
defaults meet the agent's. A namespace that cannot be read now makes the start
wait for the next sync; a bad annotation fails the start naming it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from sandlot.adapters.nodeguard import namespace_metadata
from sandlot.adapters.objects import Objects
from sandlot.agent.settings import AgentSettings
from sandlot.api.admission import Level, level_of
from sandlot.api.common import key_of
from sandlot.api.keys import DEFAULT_LIMITS_ANNOTATION
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.committed import spec_image_refusal
from sandlot.policy.limits import (
    DefaultLimits,
    LimitRefused,
    check_limits,
    merge,
    parse_defaults,
    pids_limit,
    with_defaults,
)
from sandlot.policy.podsecurity import check, describe

log = logging.getLogger(__name__)


class StartFailed(Exception):
    """A start step failed: the Sandbox ends Failed with ``reason``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


DEFAULTS_TTL = 30.0
"""Seconds a namespace's default limits are counted as last read by the capacity
judgement (a start reads them again, always)."""


NamespaceRead = Callable[[str], tuple[dict[str, str], dict[str, str]]]
"""A Namespace's labels and annotations by its name, from one read (raises the API's
exception when it cannot be read)."""


class NamespaceRules:
    def __init__(
        self,
        settings: AgentSettings,
        objects: Objects,
        clock: Callable[[], float] = time.monotonic,
        read: NamespaceRead | None = None,
    ) -> None:
        self.settings = settings
        self.objects = objects
        self._clock = clock
        self._read_namespace = read or (lambda ns: namespace_metadata(self.objects.patcher, ns))
        self._read: dict[str, tuple[float, DefaultLimits | None]] = {}

    def defaults_of(self, sandboxes: Iterable[Mapping[str, Any]]) -> dict[str, DefaultLimits]:
        """The default limits of these sandboxes' namespaces, for the capacity
        judgement, each read at most every ``DEFAULTS_TTL`` seconds. One that cannot
        be read, or whose annotation is bad, is left out: the agent's own count until
        its start reads it again (and fails naming a bad annotation)."""
        now, found = self._clock(), {}
        for sb in sandboxes:
            ns = sb["metadata"]["namespace"]
            seen = self._read.get(ns)
            if seen is None or now - seen[0] >= DEFAULTS_TTL:
                try:
                    seen = (now, self.defaults(sb))
                except StartFailed:
                    seen = (now, None)
                self._read[ns] = seen
            if seen[1] is not None:
                found[ns] = seen[1]
        return found

    def for_start(self, sb: Mapping[str, Any]) -> tuple[SandboxSpec, int] | None:
        """What a start runs: the spec validated, within the namespace's level, every
        limit filled, and its pids limit; None when the namespace cannot be read now
        (the next sync asks again). A start reads its namespace again, always, and
        once: the one read gives both its level and its default limits.

        The level is defence in depth behind the admission policy; a spec that fits
        ``restricted`` fits every level. A limit below its floor (an object stored
        before the CRD refused it) fails the start before any pull, naming the field.
        """
        try:
            spec = SandboxSpec.model_validate(sb.get("spec") or {})
        except ValidationError as exc:
            raise StartFailed(
                SandboxReason.INVALID_SPEC, f"spec rejected by the agent: {exc}"
            ) from None
        refusal = spec_image_refusal(spec.image)  # the CRD refuses it; an older object
        if refusal is not None:
            raise StartFailed(SandboxReason.INVALID_IMAGE_NAME, refusal)
        ns = sb["metadata"]["namespace"]
        try:
            labels, annotations = self._read_namespace(ns)
        except Exception as exc:
            log.warning("sandbox %s: cannot read namespace %s: %s", key_of(sb), ns, exc)
            return None
        if check(spec, Level.RESTRICTED, ns):
            violations = check(spec, level_of(labels, self.settings.default_policy_level), ns)
            if violations:
                raise StartFailed(SandboxReason.POLICY_VIOLATION, describe(violations))
        defaults = self._defaults_in(ns, annotations)
        limited = with_defaults(spec, defaults)
        try:
            pids = pids_limit(defaults)
            check_limits(limited, pids)
        except LimitRefused as exc:
            raise StartFailed(exc.reason, str(exc)) from None
        return limited, pids

    def defaults(self, sb: Mapping[str, Any]) -> DefaultLimits | None:
        """The agent's default limits under the namespace's annotation; None when the
        namespace cannot be read now (the next sync asks again)."""
        ns = sb["metadata"]["namespace"]
        try:
            _, annotations = self._read_namespace(ns)
        except Exception as exc:
            log.warning("sandbox %s: cannot read namespace %s: %s", key_of(sb), ns, exc)
            return None
        return self._defaults_in(ns, annotations)

    def _defaults_in(self, ns: str, annotations: Mapping[str, str]) -> DefaultLimits:
        text = annotations.get(DEFAULT_LIMITS_ANNOTATION, "")
        try:
            return merge(self.settings.default_limits, parse_defaults(text))
        except ValueError as exc:
            raise StartFailed(
                SandboxReason.INVALID_DEFAULT_LIMITS,
                f"namespace {ns} annotation {DEFAULT_LIMITS_ANNOTATION}: {exc}",
            ) from None


__all__ = ["NamespaceRead", "NamespaceRules", "StartFailed"]
