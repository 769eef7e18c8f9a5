"""A sandbox's attachment: what the agent plans before the container exists (so the
container's labels record everything DEL needs), attaches before the task starts
(namespace + ADD) and detaches on every teardown (DEL + namespace removal). No agent
memory is needed: an agent that crashed still releases a sandbox's address when its
sweep removes it."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sandlot.adapters.cni.config import NetworkConfigList, load_config
from sandlot.adapters.cni.errors import CniError, CniTimeout, NoNetworkConfig
from sandlot.adapters.cni.netns import Netns
from sandlot.adapters.cni.plugins import DEFAULT_IFNAME, CniResult, CniRunner, cni_args
from sandlot.api.keys import IFNAME_LABEL, NETNS_LABEL, NETWORK_LABEL

log = logging.getLogger(__name__)

# The network of an attachment that is a namespace with its loopback up and nothing
# else (no CNI network: no ADD, no DEL), for a runtime that does not bring a fresh
# namespace's loopback up itself (gVisor's runsc) when the node has no CNI. Never a
# CNI network's name (those begin with a letter or digit).
LOOPBACK_ONLY = "-loopback"


@dataclass(frozen=True)
class Attachment:
    """Everything DEL needs, recorded on the container so no agent memory is needed."""

    container_id: str
    network: str
    netns_path: str
    ifname: str = DEFAULT_IFNAME

    @property
    def netns_name(self) -> str:
        return os.path.basename(self.netns_path)

    @property
    def loopback_only(self) -> bool:
        return self.network == LOOPBACK_ONLY

    def labels(self) -> dict[str, str]:
        return {
            NETNS_LABEL: self.netns_path,
            NETWORK_LABEL: self.network,
            IFNAME_LABEL: self.ifname,
        }

    @classmethod
    def from_labels(cls, container_id: str, labels: Mapping[str, str]) -> Attachment | None:
        """None for a container that was never attached (host network, or CNI off)."""
        path = labels.get(NETNS_LABEL)
        if not path:
            return None
        return cls(
            container_id,
            labels.get(NETWORK_LABEL, ""),
            path,
            labels.get(IFNAME_LABEL) or DEFAULT_IFNAME,
        )


class SandboxNetwork:
    """The agent's use of CNI: plan an attachment (before the container is created, so
    its labels record it), attach (namespace + ADD, before the task starts), detach
    (DEL + namespace removal, on every teardown)."""

    def __init__(
        self,
        conf_dir: str,
        bin_dirs: str | Sequence[str],
        *,
        timeout: float,
        ifname: str = DEFAULT_IFNAME,
    ) -> None:
        self.conf_dir = conf_dir
        self.runner = CniRunner(bin_dirs, timeout=timeout)
        self.netns = Netns(timeout=timeout)
        self.ifname = ifname
        self.timeout = timeout
        # ADDs run one at a time: plugins that create shared state on first use race
        # otherwise (the bridge plugin of containernetworking-plugins 1.1 fails with
        # "could not set bridge's mac: invalid argument" when concurrent ADDs create
        # the bridge). An ADD takes ~15 ms; waiting for the lock is bounded too.
        self._add_lock = threading.Lock()

    @property
    def bound(self) -> float:
        """Seconds one detach can take at most: the DEL budget and two ``ip`` calls."""
        return 3 * self.timeout

    def plan(self, container_id: str) -> Attachment:
        config = load_config(self.conf_dir)
        return Attachment(
            container_id, config.name, Netns.path_of(Netns.name_for(container_id)), self.ifname
        )

    def plan_loopback(self, container_id: str) -> Attachment:
        """A namespace of the container's own with only its loopback (no CNI)."""
        return Attachment(container_id, LOOPBACK_ONLY, Netns.path_of(Netns.name_for(container_id)))

    def attach(self, attachment: Attachment, args: Mapping[str, str]) -> CniResult:
        """Create the namespace and ADD; on failure nothing is undone here: the caller
        tears the container down, which detaches (DEL is safe after a partial ADD).
        A loopback-only attachment gets its namespace and no address."""
        if attachment.loopback_only:
            self.netns.create(attachment.netns_name)
            return CniResult(cni_version="")
        config = load_config(self.conf_dir, attachment.network)
        self.netns.create(attachment.netns_name)
        if not self._add_lock.acquire(timeout=self.timeout):
            raise CniTimeout(
                f"CNI ADD of {attachment.container_id}: other ADDs held the network for "
                f"over {self.timeout:g}s"
            )
        try:
            result = self._add_with_one_retry(config, attachment, cni_args(args))
        finally:
            self._add_lock.release()
        if result.primary_ip(attachment.ifname) is None:
            raise CniError(f"CNI network {config.name} gave {attachment.container_id} no address")
        return result

    def _add_with_one_retry(
        self, config: NetworkConfigList, attachment: Attachment, args: str
    ) -> CniResult:
        """ADD; after a plugin error, DEL what it left and ADD once more.

        The first ADD on a node creates the bridge, and the bridge plugin of
        containernetworking-plugins 1.1 can then fail with "could not set bridge's
        mac: invalid argument" (a new bridge has no address until a port joins); the
        same ADD succeeds once the bridge exists. A timeout is not retried: the
        budget is spent."""

        def add() -> CniResult:
            return self.runner.add(
                config,
                container_id=attachment.container_id,
                netns=attachment.netns_path,
                ifname=attachment.ifname,
                args=args,
            )

        try:
            return add()
        except CniTimeout:
            raise
        except CniError as first:
            log.warning(
                "container %s: CNI ADD failed (%s); cleaning up and trying once more",
                attachment.container_id,
                first,
            )
            try:
                self.runner.delete(
                    config,
                    container_id=attachment.container_id,
                    netns=attachment.netns_path,
                    ifname=attachment.ifname,
                    args=args,
                )
            except CniError as cleanup:
                log.warning(
                    "container %s: DEL before the retry failed: %s",
                    attachment.container_id,
                    cleanup,
                )
            return add()

    def detach(self, attachment: Attachment, args: Mapping[str, str] | None = None) -> None:
        """DEL (with the namespace when it still exists, without when it is gone, as
        the spec allows) and remove the namespace. A network whose configuration was
        removed from the node cannot be DELeted: that is logged and the namespace
        still removed. Other failures raise, and the caller keeps the container for
        a later retry."""
        if attachment.loopback_only:
            self.netns.delete(attachment.netns_name)
            return
        netns = attachment.netns_path if os.path.exists(attachment.netns_path) else ""
        try:
            config = load_config(self.conf_dir, attachment.network or None)
        except NoNetworkConfig as exc:
            log.warning(
                "container %s: cannot DEL from network %r: %s",
                attachment.container_id,
                attachment.network,
                exc,
            )
        else:
            self.runner.delete(
                config,
                container_id=attachment.container_id,
                netns=netns,
                ifname=attachment.ifname,
                args=cni_args(args or {}),
            )
        self.netns.delete(attachment.netns_name)
