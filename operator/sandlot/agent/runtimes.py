"""The node's runtime handlers, and the RuntimeClasses of the sandboxes it starts.

Discovery reads containerd's configuration and the runtime fragments at start-up,
and again on the sync passes, at most every ``HANDLERS_REFRESH`` seconds: a
runtime an installer puts on the node later (the chart's, into ``runtimes_dir``)
needs no containerd restart, since the agent names the shim by its path and hands
it its options itself, so the handler is published (and a removed one withdrawn)
while the agent runs. The decisions are ``policy.runtimeclass``'s. RuntimeClasses
are read through the API server when a sandbox names one and kept for a few
seconds: a sync pass asks for every sandbox's class, and a fleet uses few classes.
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
    CRI_PLUGINS,
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
HANDLERS_REFRESH = 10.0  # seconds between two discoveries of the node's handlers


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


def discover(
    config_path: str,
    runtimes_dir: str = "",
    found: Callable[[str], bool] = binary_found,
    *,
    quiet: bool = False,
    containerd_version: str = "",
) -> Discovery:
    """The handlers containerd's configuration at ``config_path`` offers, with those
    the fragments ``runtimes_dir/*.toml`` declare (the chart's runtime installers
    write one per runtime; the configuration wins where both name a handler).
    ``quiet``: log nothing (a periodic rediscovery)."""
    path = Path(config_path)
    try:
        config: dict[str, Any] = tomllib.loads(path.read_text())
    except FileNotFoundError:
        config = {}
        if not quiet:
            log.info("containerd_config %s does not exist: runtime handler runc only", path)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ContainerdConfigUnreadable(
            f"{setting_name('containerd_config')} {path} cannot be read as TOML: {exc}"
        ) from None
    for fragment in _fragments(runtimes_dir):
        try:
            _merge_missing(config, tomllib.loads(fragment.read_text()))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            log.warning("runtime fragment %s is left out: %s", fragment, exc)
    found_here = discover_handlers(config, found, containerd_version)
    if not quiet:
        for name, why in found_here.skipped:
            log.warning("runtime handler %s of %s is not offered: %s", name, path, why)
        log.info("runtime handlers offered: %s", ", ".join(found_here.names))
    return found_here


def _fragments(runtimes_dir: str) -> list[Path]:
    if not runtimes_dir:
        return []
    try:
        return sorted(p for p in Path(runtimes_dir).glob("*.toml") if p.is_file())
    except OSError:
        return []


def _merge_missing(into: dict[str, Any], add: Mapping[str, Any]) -> None:
    """The runtimes ``add`` declares, each under its CRI plugin, into ``into``; a
    handler ``into`` declares already stays as it is, whole."""
    for plugin in CRI_PLUGINS:
        added = (((add.get("plugins") or {}).get(plugin) or {}).get("containerd") or {}).get(
            "runtimes"
        ) or {}
        if not isinstance(added, Mapping) or not added:
            continue
        runtimes = (
            into.setdefault("plugins", {})
            .setdefault(plugin, {})
            .setdefault("containerd", {})
            .setdefault("runtimes", {})
        )
        for name, body in added.items():
            runtimes.setdefault(name, body)


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
        rediscover: Callable[[], Discovery] | None = None,
        publish: Callable[[Discovery], object] = lambda _discovery: None,
        refresh_interval: float = HANDLERS_REFRESH,
    ) -> None:
        self._read = read
        self.node = node
        self.discovery = discovery
        self._clock = clock
        self._ttl = ttl
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[float, Mapping[str, Any] | None]] = {}
        self._rediscover = rediscover
        self._publish = publish
        self._refresh_interval = refresh_interval
        self._discovered_at = clock()
        self._published = True

    def refresh(self) -> bool:
        """Discover the node's handlers again once ``refresh_interval`` has passed since
        the last time; publish them when they changed (or their last publication
        failed). True when the offered handlers changed."""
        now = self._clock()
        if self._rediscover is None or now - self._discovered_at < self._refresh_interval:
            return False
        self._discovered_at = now
        try:
            found = self._rediscover()
        except Exception as exc:
            log.warning("runtime handlers not discovered again: %s", exc)
            return False
        changed = found.names != self.discovery.names
        if changed:
            log.info(
                "runtime handlers offered now: %s (were: %s)",
                ", ".join(found.names),
                ", ".join(self.discovery.names),
            )
        self.discovery = found
        if changed or not self._published:
            try:
                self._publish(found)
                self._published = True
            except Exception as exc:
                self._published = False
                log.warning("runtime handlers not published: %s", exc)
        return changed

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
        self.refresh()
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
