"""Runtime classes: which runtime handler runs a sandbox, where it may go and what
it costs. Pure.

A sandbox's ``spec.runtimeClassName`` has a Pod's meaning: the RuntimeClass
(``node.k8s.io/v1``) of that name gives the ``handler`` the node's containerd runs
it with, ``scheduling`` (a node selector and tolerations joined to the sandbox's
own) and ``overhead.podFixed`` (counted in the node's capacity beside its limits).

A node's handlers are what its containerd's CRI configuration declares, each
offered only when its binaries exist, and ``runc`` always (containerd's default
runtime needs no declaration). The agent drives the runc shim itself, so a
runc-shim handler's ``BinaryName`` (crun, say) is honoured by passing the shim
the same option the CRI plugin would. A class sandlot cannot honour fully (an
overhead in a resource it does not count) is refused rather than half-applied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from sandlot.api.placement import Toleration
from sandlot.api.reasons import SandboxReason
from sandlot.policy.ocispec import EXECUTOR, FILES_TOOL
from sandlot.policy.placement import Placement
from sandlot.policy.quantity import memory_bytes, parse_quantity

RUNC = "runc"
RUNC_RUNTIME_TYPE = "io.containerd.runc.v2"
# Where each CRI configuration version keeps its runtimes (1.x's version 2, 2.x's 3).
CRI_PLUGINS = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")

CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"

HANDLER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
COUNTED_OVERHEAD = ("cpu", "memory")


@dataclass(frozen=True)
class RuntimeHandler:
    """A runtime the node's containerd offers: the shim (``runtime_type``) and, for
    the runc shim, the OCI runtime binary it runs ("": runc)."""

    name: str
    runtime_type: str = RUNC_RUNTIME_TYPE
    binary_name: str = ""
    runtime_path: str = ""
    """The shim binary's path when the configuration names it (``runtime_path``),
    else "" (containerd finds the shim by ``runtime_type`` on its PATH)."""
    config_path: str = ""
    """For a shim of its own kind (gVisor's), its ``options.ConfigPath``: the file of
    the shim's own options (runsc's path, its flags), handed to the shim as CRI
    does (``runtimeoptions.v1.Options``); "" when the configuration names none."""

    @property
    def shim(self) -> str:
        """What containerd is asked to run: the shim's path, else its type."""
        return self.runtime_path or self.runtime_type


@dataclass(frozen=True)
class Discovery:
    """The handlers found, and each one left out with why."""

    handlers: tuple[RuntimeHandler, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(h.name for h in self.handlers)

    def get(self, name: str) -> RuntimeHandler | None:
        return next((h for h in self.handlers if h.name == name), None)


@dataclass(frozen=True)
class RuntimeClassInfo:
    """What sandlot takes from a RuntimeClass."""

    name: str
    handler: str
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    overhead_memory: int = 0
    """Bytes."""
    overhead_cpu_millis: int = 0


class RuntimeClassRefused(Exception):
    """A sandbox's runtime class cannot be honoured; ``reason`` is its status reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def shim_binary(runtime_type: str) -> str:
    """The shim binary containerd starts for ``runtime_type``, by its naming rule
    (``io.containerd.runsc.v1`` -> ``containerd-shim-runsc-v1``)."""
    parts = runtime_type.split(".")
    return f"containerd-shim-{parts[-2]}-{parts[-1]}" if len(parts) >= 2 else runtime_type


RUNSC_SHIM = "containerd-shim-runsc-v1"


def containerd_major(version: str) -> int | None:
    """The major version of containerd's ``version`` ("1.6.20", "v2.4.2"); None if
    it cannot be read."""
    head = version.strip().lstrip("v").split(".", 1)[0]
    return int(head) if head.isdigit() else None


def needs_containerd2(runtime_type: str, path: str, containerd_version: str) -> str | None:
    """Why this node's containerd cannot run the handler's shim, or None. gVisor's
    shim (as built from its Go module's ``go`` branch, which sandlot installs)
    answers containerd's start with 2.x's bootstrap, which 1.x cannot read: every
    start would fail, so the handler is not offered there."""
    major = containerd_major(containerd_version)
    shim = path or shim_binary(runtime_type)
    runsc = shim_binary(runtime_type) == RUNSC_SHIM or shim.rsplit("/", 1)[-1] == RUNSC_SHIM
    if runsc and major is not None and major < 2:
        return f"its shim {shim} needs containerd 2.x; this node runs {containerd_version}"
    return None


def discover_handlers(
    config: Mapping[str, Any], found: Callable[[str], bool], containerd_version: str = ""
) -> Discovery:
    """The handlers of containerd's configuration ``config`` (its TOML, parsed);
    ``found(binary)`` says whether a binary (a path or a name on PATH) exists;
    ``containerd_version`` (when known) leaves out shims it cannot run."""
    declared: dict[str, Mapping[str, Any]] = {}
    plugins = config.get("plugins") or {}
    for plugin in CRI_PLUGINS:
        runtimes = ((plugins.get(plugin) or {}).get("containerd") or {}).get("runtimes") or {}
        for name, body in runtimes.items():
            if isinstance(body, Mapping):
                declared.setdefault(str(name), body)
    handlers: list[RuntimeHandler] = []
    skipped: list[tuple[str, str]] = []
    for name, body in sorted(declared.items()):
        runtime_type = str(body.get("runtime_type") or RUNC_RUNTIME_TYPE)
        options = body.get("options") or {}
        binary = str(options.get("BinaryName") or "") if runtime_type == RUNC_RUNTIME_TYPE else ""
        path = str(body.get("runtime_path") or "")
        config_path = (
            str(options.get("ConfigPath") or "") if runtime_type != RUNC_RUNTIME_TYPE else ""
        )
        shim = path or shim_binary(runtime_type)
        if not HANDLER_NAME.match(name) or len(name) > 63:
            skipped.append((name, "not a valid handler name (a DNS label)"))
        elif (path or runtime_type != RUNC_RUNTIME_TYPE) and not found(shim):
            skipped.append((name, f"its shim {shim} is not installed"))
        elif binary and not found(binary):
            skipped.append((name, f"its BinaryName {binary} does not exist"))
        elif too_old := needs_containerd2(runtime_type, path, containerd_version):
            skipped.append((name, too_old))
        else:
            handlers.append(RuntimeHandler(name, runtime_type, binary, path, config_path))
    if not any(h.name == RUNC for h in handlers) and RUNC not in dict(skipped):
        handlers.insert(0, RuntimeHandler(RUNC))
    return Discovery(tuple(handlers), tuple(skipped))


def host_view(runtime_name: str) -> bool:
    """Whether the node sees a container of this shim from outside: its task's
    ``/proc/<pid>/root`` is the container's filesystem and its network namespace's
    loopback is the container's. True for the runc shim (runc, crun through
    ``BinaryName``, or a blank name: containerd's default); False for any other
    shim (gVisor's: its task is the sandbox process, whose files and loopback are
    the sentry's), whose files are reached through the container and ports through
    the sandbox's own address."""
    if not runtime_name:
        return True
    shim = runtime_name.rsplit("/", 1)[-1]
    return runtime_name == RUNC_RUNTIME_TYPE or shim == shim_binary(RUNC_RUNTIME_TYPE)


def as_pod_sandbox(oci_spec: dict[str, Any], handler: RuntimeHandler | None) -> dict[str, Any]:
    """The spec with CRI's annotations saying it is a pod's sandbox, for a shim of
    its own kind (gVisor's): such a shim runs a spec without them as a container
    joining a pod, and never hands it its stdio. A sandlot sandbox is a pod of one;
    the runc shim needs nothing, so its specs stay as they are."""
    if handler is None or handler.runtime_type == RUNC_RUNTIME_TYPE:
        return oci_spec
    annotations = dict(oci_spec.get("annotations") or {})
    annotations[CRI_CONTAINER_TYPE] = "sandbox"
    return {**oci_spec, "annotations": annotations}


def with_files_tool(
    oci_spec: dict[str, Any], source: str | None, handler: RuntimeHandler | None
) -> dict[str, Any]:
    """The spec with the node's files tool (``source``; None: the node has none)
    mounted at ``ocispec.FILES_TOOL``, for a handler with a host view (gVisor's
    sandboxes keep reaching files through their image's own tools)."""
    if not source or (handler is not None and not host_view(handler.shim)):
        return oci_spec
    tool = {"destination": FILES_TOOL, "type": "bind", "source": source}
    mount = {**tool, "options": ["bind", "ro", "nosuid", "nodev"]}
    return {**oci_spec, "mounts": [*oci_spec.get("mounts", []), mount]}


def with_executor(
    oci_spec: dict[str, Any], source: str | None, handler: RuntimeHandler | None
) -> dict[str, Any]:
    """The spec with the node's executor (``source``; None: none) mounted read-only at
    ``ocispec.EXECUTOR``, for a handler with a host view as the files tool is. gVisor's
    sandboxes have none: their commands go through the runtime's exec."""
    if not source or (handler is not None and not host_view(handler.shim)):
        return oci_spec
    mount = {
        "destination": EXECUTOR,
        "type": "bind",
        "source": source,
        "options": ["bind", "ro", "nosuid", "nodev"],
    }
    return {**oci_spec, "mounts": [*oci_spec.get("mounts", []), mount]}


def read_runtime_class(name: str, body: Mapping[str, Any] | None) -> RuntimeClassInfo:
    """The RuntimeClass ``name`` as read (``body``; None: it does not exist), or
    ``RuntimeClassRefused`` saying why a sandbox cannot run under it."""
    if body is None:
        raise RuntimeClassRefused(
            SandboxReason.RUNTIME_CLASS_NOT_FOUND, f'RuntimeClass "{name}" does not exist'
        )

    def invalid(why: str) -> RuntimeClassRefused:
        return RuntimeClassRefused(
            SandboxReason.INVALID_RUNTIME_CLASS, f'RuntimeClass "{name}": {why}'
        )

    handler = str(body.get("handler") or "")
    if not HANDLER_NAME.match(handler) or len(handler) > 63:
        raise invalid(f"handler {handler!r} is not a DNS label")
    scheduling = body.get("scheduling") or {}
    try:
        tolerations = tuple(
            Toleration.model_validate(t) for t in scheduling.get("tolerations") or []
        )
    except ValidationError as exc:
        raise invalid(f"scheduling.tolerations: {exc.errors()[0]['msg']}") from None
    selector = tuple(
        sorted((str(k), str(v)) for k, v in (scheduling.get("nodeSelector") or {}).items())
    )
    fixed = (body.get("overhead") or {}).get("podFixed") or {}
    uncounted = sorted(set(fixed) - set(COUNTED_OVERHEAD))
    if uncounted:
        raise invalid(
            f"overhead.podFixed names {', '.join(uncounted)}; sandlot counts only cpu and "
            "memory in a node's capacity"
        )
    try:
        memory = memory_bytes(str(fixed["memory"])) if "memory" in fixed else 0
        cpu = int(parse_quantity(str(fixed["cpu"])) * 1000) if "cpu" in fixed else 0
    except ValueError as exc:
        raise invalid(f"overhead.podFixed: {exc}") from None
    return RuntimeClassInfo(name, handler, selector, tolerations, memory, cpu)


def check_handler(info: RuntimeClassInfo, node: str, offered: Sequence[str]) -> None:
    """Refuse a class whose handler the node does not offer, naming both."""
    if info.handler not in offered:
        raise RuntimeClassRefused(
            SandboxReason.RUNTIME_HANDLER_UNKNOWN,
            f'RuntimeClass "{info.name}" asks for runtime handler "{info.handler}", which '
            f"node {node} does not offer (it offers: {', '.join(sorted(offered)) or 'none'})",
        )


def joined_placement(placement: Placement | None, info: RuntimeClassInfo) -> Placement | None:
    """The sandbox's placement with the class's tolerations added, as the RuntimeClass
    admission plugin merges them into a Pod. The class's node selector is not joined:
    it names the Kubernetes Nodes' labels, which a SandboxNode does not carry, and is
    matched against them where the node is chosen (``policy.nodetrust``)."""
    if not info.tolerations:
        return placement
    base = placement or Placement()
    return Placement(
        tolerations=(*base.tolerations, *info.tolerations),
        node_selector=base.node_selector,
        affinity=base.affinity,
    )


__all__ = [
    "RUNC",
    "Discovery",
    "RuntimeClassInfo",
    "RuntimeClassRefused",
    "RuntimeHandler",
    "as_pod_sandbox",
    "check_handler",
    "discover_handlers",
    "host_view",
    "joined_placement",
    "read_runtime_class",
    "shim_binary",
    "with_executor",
    "with_files_tool",
]
