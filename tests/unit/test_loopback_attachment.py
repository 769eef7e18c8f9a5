"""A loopback-only attachment (the agent's own namespace for a handler without a
host view, with CNI off) is recorded on the container and read back as one, and a
CNI network's is never taken for it."""

from __future__ import annotations

from pathlib import Path

from sandlot.adapters.cni import LOOPBACK_ONLY, Attachment, SandboxNetwork
from sandlot.agent.network import may_make_namespaces


def test_a_loopback_only_attachment_is_read_back_from_its_labels(tmp_path: Path) -> None:
    network = SandboxNetwork(str(tmp_path / "conf"), str(tmp_path / "bin"), timeout=5)
    planned = network.plan_loopback("sb-1")
    assert planned.loopback_only
    assert planned.netns_path.endswith("sandlot-sb-1")
    read = Attachment.from_labels("sb-1", planned.labels())
    assert read is not None and read.loopback_only, planned.labels()
    assert read.netns_path == planned.netns_path


def test_no_cni_network_name_is_the_loopback_marker() -> None:
    # CNI network names begin with a letter or a digit.
    assert not LOOPBACK_ONLY[0].isalnum()
    cni = Attachment("sb-2", "bridge-net", "/run/netns/sandlot-sb-2")
    assert not cni.loopback_only
    read = Attachment.from_labels("sb-2", cni.labels())
    assert read is not None and not read.loopback_only and read.network == "bridge-net"


def test_namespaces_are_made_only_with_cap_sys_admin_where_they_can_be_kept(
    tmp_path: Path,
) -> None:
    status = tmp_path / "status"
    kept = tmp_path / "netns"
    status.write_text("Name:\tagent\nCapEff:\t00000000a80425fb\n")  # a container's default set
    assert not may_make_namespaces(str(status), str(kept))
    status.write_text("Name:\tagent\nCapEff:\t000001ffffffffff\n")  # root, every capability
    assert may_make_namespaces(str(status), str(kept))
    # Nowhere to keep them (as a read-only /run in the chart's pod): none made.
    assert not may_make_namespaces(str(status), str(tmp_path / "absent" / "netns"))
