"""The node's runtime handlers, and the RuntimeClasses of the sandboxes it starts.

Discovery reads containerd's configuration once, at start-up (a handler added
later needs containerd restarted anyway, and the agent with it); the decisions
are ``policy.runtimeclass``'s. RuntimeClasses are read through the API server when
a sandbox names one and kept for a few seconds: a sync pass asks for every
sandbox's class, and a fleet uses few classes.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandlot.adapters.startup import StartupError, setting_name
from sandlot.policy.runtimeclass import (
    Discovery,
    RuntimeClassInfo,
    RuntimeClassRefused,
    RuntimeHandler,
    check_handler,
    discover_handlers,
    read_runtime_class,
)

log = logging.getLogger(__name__)

CLASS_TTL = 5.0  # seconds a RuntimeClass read is reused


class ContainerdConfigUnreadable(StartupError):
    """The configured containerd configuration exists but cannot be read as TOML:
    the agent refuses to start (one line naming the setting) rather than offer
    handlers it would guess."""


def binary_found(binary: str) -> bool:
    """A path that is an executable file, or a name on PATH (where containerd finds
    shims and the runc shim its ``BinaryName``)."""
    if os.path.isabs(binary):
        return os.path.isfile(binary) and os.access(binary, os.X_OK)
    return shutil.which(binary) is not None


def discover(config_path: str, found: Callable[[str], bool] = binary_found) -> Discovery:
    """The handlers containerd's configuration at ``config_path`` offers."""
    path = Path(config_path)
    try:
        config: Mapping[str, Any] = tomllib.loads(path.read_text())
    except FileNotFoundError:
        config = {}
        log.info("containerd_config %s does not exist: runtime handler runc only", path)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ContainerdConfigUnreadable(
            f"{setting_name('containerd_config')} {path} cannot be read as TOML: {exc}"
        ) from None
    found_here = discover_handlers(config, found)
    for name, why in found_here.skipped:
        log.warning("runtime handler %s of %s is not offered: %s", name, path, why)
    log.info("runtime handlers offered: %s", ", ".join(found_here.names))
    return found_here


class RuntimeClasses:
    """This node's view of RuntimeClasses: ``resolve`` a sandbox's spec to the class
    and the handler that runs it (both None without a class), raising
    ``RuntimeClassRefused`` when it cannot run here."""

    def __init__(
        self,
        read: Callable[[str], Mapping[str, Any] | None],
        node: str,
        discovery: Discovery,
        *,
        clock: Callable[[], float] = time.monotonic,
        ttl: float = CLASS_TTL,
    ) -> None:
        self._read = read
        self.node = node
        self.discovery = discovery
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, Mapping[str, Any] | None]] = {}

    def body(self, name: str) -> Mapping[str, Any] | None:
        """The RuntimeClass as last read within the TTL (None: it does not exist); an
        API failure raises."""
        now = self._clock()
        with self._lock:
            kept = self._seen.get(name)
        if kept is not None and now - kept[0] < self._ttl:
            return kept[1]
        body = self._read(name)
        with self._lock:
            self._seen[name] = (now, body)
        return body

    def info(self, spec: Mapping[str, Any]) -> RuntimeClassInfo | None:
        name = spec.get("runtimeClassName")
        if not name:
            return None
        return read_runtime_class(str(name), self.body(str(name)))

    def resolve(
        self, spec: Mapping[str, Any]
    ) -> tuple[RuntimeClassInfo | None, RuntimeHandler | None]:
        info = self.info(spec)
        if info is None:
            return None, None
        check_handler(info, self.node, self.discovery.names)
        return info, self.discovery.get(info.handler)

    def survey(
        self, specs: Mapping[str, Mapping[str, Any]], starting: Sequence[str]
    ) -> ClassSurvey:
        """The classes of the sandboxes ``specs`` (key -> spec) for one sync pass: each
        one's class (its overhead counts in capacity), and of those ``starting``, the
        ones refused and the ones whose class cannot be read now."""
        survey = ClassSurvey()
        for key, spec in specs.items():
            if not spec.get("runtimeClassName"):
                continue
            try:
                if key in starting:
                    info, _ = self.resolve(spec)
                else:
                    info = self.info(spec)
            except RuntimeClassRefused as exc:
                if key in starting:
                    survey.refused[key] = (exc.reason, str(exc))
                continue
            except Exception as exc:
                if key in starting:
                    log.warning("sandbox %s: its RuntimeClass cannot be read: %s", key, exc)
                    survey.unreadable.add(key)
                continue
            if info is not None:
                survey.classes[key] = info
        return survey


@dataclass
class ClassSurvey:
    classes: dict[str, RuntimeClassInfo] = field(default_factory=dict)
    refused: dict[str, tuple[str, str]] = field(default_factory=dict)
    unreadable: set[str] = field(default_factory=set)


__all__ = [
    "ClassSurvey",
    "ContainerdConfigUnreadable",
    "RuntimeClasses",
    "binary_found",
    "discover",
]
