"""The pure parts of the CNI client: which configuration the node's network is, what
each plugin reads, what a result's address is, and what a failure says."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sandlot.adapters.cni import (
    Attachment,
    CniError,
    NetworkConfigList,
    NoNetworkConfig,
    cni_args,
    join_netns,
    parse_config,
    parse_error,
    parse_result,
    plugin_stdin,
    select_config_file,
)


@pytest.mark.parametrize(
    ("names", "chosen"),
    [
        (["10-kindnet.conflist", "99-loopback.conf"], "10-kindnet.conflist"),
        (["20-b.conf", "10-a.json", "05-c.conflist"], "05-c.conflist"),
        (["README", "10-net.conflist.bak", "net.yaml"], None),
        ([".10-editor.conflist", "20-net.conf"], "20-net.conf"),
        ([], None),
    ],
    ids=[
        "lexically-first-wins",
        "every-cni-suffix-counts",
        "other-files-are-ignored",
        "hidden-files-are-ignored",
        "empty-dir-has-none",
    ],
)
def test_config_file_is_the_lexically_first_with_a_cni_suffix(
    names: list[str], chosen: str | None
) -> None:
    assert select_config_file(names) == chosen


def test_a_conflist_keeps_its_chain_in_order() -> None:
    config = parse_config(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": "kindnet",
                "plugins": [{"type": "ptp", "ipMasq": False}, {"type": "portmap"}],
            }
        )
    )
    assert config.name == "kindnet" and config.cni_version == "1.0.0"
    assert [p["type"] for p in config.plugins] == ["ptp", "portmap"]


def test_a_single_conf_becomes_a_chain_of_one_without_name_and_version() -> None:
    config = parse_config(
        json.dumps({"cniVersion": "0.3.1", "name": "br", "type": "bridge", "bridge": "cni0"})
    )
    assert config.plugins == ({"type": "bridge", "bridge": "cni0"},)
    assert config.cni_version == "0.3.1"


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("{not json", "not JSON"),
        ("[]", "not a JSON object"),
        (json.dumps({"plugins": [{"type": "bridge"}]}), "no network name"),
        (json.dumps({"name": "n", "plugins": []}), "non-empty list"),
        (json.dumps({"name": "n", "plugins": [{"bridge": "x"}]}), "plugin 0 has no 'type'"),
        (json.dumps({"name": "n"}), "neither 'plugins' nor 'type'"),
    ],
    ids=["not-json", "not-an-object", "no-name", "empty-chain", "plugin-no-type", "no-plugins"],
)
def test_a_bad_configuration_is_refused_saying_why(text: str, complaint: str) -> None:
    with pytest.raises(NoNetworkConfig, match=complaint):
        parse_config(text, "/etc/cni/net.d/10-x.conflist")


def test_each_plugin_reads_its_config_with_the_lists_name_version_and_prev_result() -> None:
    config = NetworkConfigList("net", "1.0.0", ({"type": "bridge"}, {"type": "portmap"}))
    prev = {"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]}
    assert plugin_stdin(config, config.plugins[0], None) == {
        "type": "bridge",
        "name": "net",
        "cniVersion": "1.0.0",
    }
    second = plugin_stdin(config, config.plugins[1], prev)
    assert second["prevResult"] == prev and second["name"] == "net"
    assert "prevResult" not in config.plugins[1], "the configuration itself was changed"


BRIDGE_RESULT: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "interfaces": [
        {"name": "cni0", "mac": "aa:aa:aa:aa:aa:aa"},
        {"name": "veth1", "mac": "bb:bb:bb:bb:bb:bb"},
        {"name": "eth0", "mac": "cc:cc:cc:cc:cc:cc", "sandbox": "/run/netns/x"},
    ],
    "ips": [
        {"interface": 2, "address": "fd00::5/64"},
        {"interface": 2, "address": "10.77.0.5/24", "gateway": "10.77.0.1"},
    ],
}


@pytest.mark.parametrize(
    ("result", "ip"),
    [
        (BRIDGE_RESULT, "10.77.0.5"),
        (
            {
                "cniVersion": "0.4.0",
                "interfaces": [
                    {"name": "eth1", "sandbox": "/x"},
                    {"name": "eth0", "sandbox": "/x"},
                ],
                "ips": [
                    {"version": "4", "interface": 0, "address": "192.168.0.9/24"},
                    {"version": "4", "interface": 1, "address": "10.1.0.3/16"},
                ],
            },
            "10.1.0.3",
        ),
        ({"cniVersion": "1.0.0", "ips": [{"address": "10.2.0.7/24"}]}, "10.2.0.7"),
        ({"cniVersion": "1.0.0", "ips": [{"address": "fd00::7/64"}]}, "fd00::7"),
        ({"cniVersion": "0.2.0", "ip4": {"ip": "10.3.0.4/24", "gateway": "10.3.0.1"}}, "10.3.0.4"),
        ({"cniVersion": "1.0.0", "interfaces": [], "ips": []}, None),
    ],
    ids=[
        "ipv4-on-the-container-interface-over-ipv6",
        "the-container-ifname-over-other-interfaces",
        "an-address-without-interface-index",
        "ipv6-when-there-is-nothing-else",
        "legacy-0.2-ip4",
        "no-address",
    ],
)
def test_the_published_address_is_the_first_ipv4_on_the_container_interface(
    result: dict[str, Any], ip: str | None
) -> None:
    assert parse_result(result).primary_ip("eth0") == ip


@pytest.mark.parametrize(
    ("stdout", "stderr", "code", "says"),
    [
        (
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "code": 7,
                    "msg": "invalid network config",
                    "details": "ranges missing",
                }
            ),
            "",
            7,
            "CNI plugin bridge ADD failed: invalid network config (ranges missing) "
            "[code 7: invalid network config]",
        ),
        (
            json.dumps({"code": 999, "msg": "failed to open netns"}),
            "",
            999,
            "CNI plugin bridge ADD failed: failed to open netns [code 999: plugin-specific]",
        ),
        (b"", b"panic: boom\nexit\n", 0, "CNI plugin bridge ADD failed: exit"),
        ("garbage", "", 0, "CNI plugin bridge ADD failed: garbage"),
        ("", "", 0, "CNI plugin bridge ADD failed: exit status 2"),
    ],
    ids=[
        "spec-error-with-details",
        "plugin-specific-code",
        "stderr-when-no-error-json",
        "non-json-stdout",
        "nothing-at-all",
    ],
)
def test_a_failed_plugin_becomes_one_clear_error(
    stdout: str | bytes, stderr: str | bytes, code: int, says: str
) -> None:
    error = parse_error(stdout, stderr, 2, plugin="bridge", command="ADD")
    assert isinstance(error, CniError)
    assert str(error) == says
    assert error.code == code and error.plugin == "bridge" and error.command == "ADD"


def test_cni_args_let_plugins_ignore_the_kubernetes_keys() -> None:
    assert cni_args({"K8S_POD_NAMESPACE": "ns", "K8S_POD_NAME": "web-1"}) == (
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=web-1"
    )


def test_the_spec_joins_the_named_namespace_and_a_host_network_spec_stays_as_it_is() -> None:
    spec = {"linux": {"namespaces": [{"type": "pid"}, {"type": "network"}]}}
    assert join_netns(spec, "/run/netns/sandlot-c")["linux"]["namespaces"] == [
        {"type": "pid"},
        {"type": "network", "path": "/run/netns/sandlot-c"},
    ]
    host = {"linux": {"namespaces": [{"type": "pid"}]}}
    assert join_netns(host, "/run/netns/sandlot-c") == {"linux": {"namespaces": [{"type": "pid"}]}}


def test_an_attachment_survives_the_round_trip_through_container_labels() -> None:
    attachment = Attachment("sb-1", "kindnet", "/run/netns/sandlot-sb-1", "eth0")
    assert Attachment.from_labels("sb-1", attachment.labels()) == attachment
    assert Attachment.from_labels("sb-1", {"sandlot.dev/sandbox": "ns/a"}) is None
