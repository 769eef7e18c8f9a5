"""A sandbox's network as the agent uses it: which mode, the CNI_ARGS, attach, release.

Everything a release needs is on the container's labels (``Attachment``), so a
restarted agent releases what an earlier one attached. A release that fails keeps
the container (teardown retries it on a later pass) until it has failed for
``RELEASE_PATIENCE`` seconds: a network daemon restarting must not leak addresses,
and a broken or removed network configuration must not keep a node retrying forever.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sandlot.adapters.cni import (
    NETNS_DIR,
    Attachment,
    CniError,
    CniResult,
    NoNetworkConfig,
    SandboxNetwork,
    load_config,
)
from sandlot.adapters.runtime import ContainerInfo
from sandlot.agent.netsettings import NetworkMode
from sandlot.agent.settings import AgentSettings
from sandlot.api.common import split_key
from sandlot.api.keys import SANDBOX_LABEL, SANDBOX_UID_LABEL

log = logging.getLogger(__name__)

# How long a failing CNI DEL keeps its container for retries before the agent gives
# up on it (a broken or removed network configuration never DELs): long enough for a
# network daemon to restart, short enough that a node does not retry forever.
RELEASE_PATIENCE = 120.0


def resolve_network_mode(settings: AgentSettings) -> bool:
    """Whether sandboxes without hostNetwork are attached through CNI."""
    mode = settings.network_mode
    if mode is NetworkMode.AUTO:
        try:
            config = load_config(settings.cni_conf_dir)
        except NoNetworkConfig as exc:
            log.info("network mode auto: %s: sandboxes report the node's address", exc)
            return False
        log.info("network mode auto: CNI network %s from %s", config.name, config.source)
        return True
    log.info("network mode %s", mode.value)
    return mode is NetworkMode.CNI


def cni_args(labels: Mapping[str, str], container_id: str) -> dict[str, str]:
    """The Kubernetes CNI_ARGS the kubelet passes too (plugins may key on them)."""
    key = labels.get(SANDBOX_LABEL, "")
    ns, name = split_key(key) if "/" in key else ("", "")  # no sandbox's: no pod names
    args = {"K8S_POD_NAMESPACE": ns, "K8S_POD_NAME": name}
    if labels.get(SANDBOX_UID_LABEL):
        args["K8S_POD_UID"] = labels[SANDBOX_UID_LABEL]
    args["K8S_POD_INFRA_CONTAINER_ID"] = container_id
    return {k: v for k, v in args.items() if v}


CAP_SYS_ADMIN = 21


def may_make_namespaces(status: str = "/proc/self/status", netns_dir: str = NETNS_DIR) -> bool:
    """Whether this process can make named namespaces: it holds CAP_SYS_ADMIN
    (``ip netns add`` needs it) and may write where they are kept (in the chart's
    pod, without the CNI mount, ``/run`` is read-only)."""
    held = False
    for line in Path(status).read_text().splitlines():
        if line.startswith("CapEff:"):
            held = bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    where = Path(netns_dir)
    return held and os.access(where if where.exists() else where.parent, os.W_OK)


class Networking:
    """The agent's CNI use: ``enabled`` per the network mode; ``release`` always works
    (a container attached under an earlier setting is still detached)."""

    def __init__(
        self,
        settings: AgentSettings,
        list_containers: Callable[[], list[ContainerInfo]],
    ) -> None:
        self.network = SandboxNetwork(
            settings.cni_conf_dir,
            settings.cni_bin_dir,
            timeout=settings.cni_timeout.total_seconds(),
        )
        self.enabled = resolve_network_mode(settings)
        # Whether it may make a namespace of its own for a runtime that leaves a fresh
        # one's loopback down (runsc) when CNI is off: only with CAP_SYS_ADMIN. The
        # chart's unprivileged agent has no such right and no shared /run/netns; there
        # a gVisor sandbox keeps the runtime's namespace (no loopback) as before.
        self.own_namespaces = may_make_namespaces()
        if not self.enabled:
            log.info(
                "loopback namespaces for runtimes without a host view: %s",
                "made by the agent"
                if self.own_namespaces
                else "not made (no CAP_SYS_ADMIN, or /run/netns not writable)",
            )
        self._list_containers = list_containers
        self._failing_since: dict[str, float] = {}

    @property
    def bound(self) -> float:
        """Seconds one release can take at most."""
        return self.network.bound

    def plan(self, container_id: str) -> Attachment:
        return self.network.plan(container_id)

    def plan_loopback(self, container_id: str) -> Attachment:
        """A namespace with only its loopback up, made by the agent: for a runtime
        that leaves a fresh namespace's loopback down (runsc) when CNI is off."""
        return self.network.plan_loopback(container_id)

    def attach(self, attachment: Attachment, labels: Mapping[str, str]) -> CniResult:
        return self.network.attach(attachment, cni_args(labels, attachment.container_id))

    def release(self, container: ContainerInfo | str, *, patience: float = -1) -> None:
        """Teardown's hook: CNI DEL and namespace removal, from the container's labels.

        A failure raises (teardown keeps the container, the next pass retries) until
        it has failed for ``patience`` seconds (default ``RELEASE_PATIENCE``; 0 gives
        up at once): then the error is logged naming what may stay allocated, the
        namespace is removed anyway and the teardown goes on.
        """
        if patience < 0:
            patience = RELEASE_PATIENCE
        if isinstance(container, str):
            matches = [c for c in self._list_containers() if c.id == container]
            if not matches:
                return
            container = matches[0]
        attachment = Attachment.from_labels(container.id, container.labels)
        if attachment is None:
            return
        try:
            self.network.detach(attachment, cni_args(container.labels, container.id))
        except CniError as exc:
            first = self._failing_since.setdefault(container.id, time.monotonic())
            if time.monotonic() - first < patience:
                raise
            log.error(
                "container %s: giving up on CNI DEL from network %s after %.0fs; its "
                "address may stay allocated: %s",
                container.id,
                attachment.network,
                time.monotonic() - first,
                exc,
            )
            self.network.netns.delete(attachment.netns_name)
        self._failing_since.pop(container.id, None)


__all__ = [
    "RELEASE_PATIENCE",
    "Networking",
    "cni_args",
    "may_make_namespaces",
    "resolve_network_mode",
]
