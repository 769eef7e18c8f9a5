"""The network policy as rules: pure, plain data (sandlot.policy.netpolicy), and the
API's refusals of bad policies (sandlot.api.netpolicy)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from pydantic import ValidationError

from sandlot.agent.settings import AgentSettings
from sandlot.api.netpolicy import LabelSelector, SandboxNetworkPolicy
from sandlot.api.sandbox import SandboxPort, SandboxSpec
from sandlot.policy.netpolicy import (
    ClusterDefault,
    Peer,
    effective,
    parse_namespace_default,
    render_rulesets,
    reserved_port_refusal,
    selector_matches,
    selector_string,
)

NODE = ["192.0.2.10", "10.77.0.1", "fe80::1"]


def policy(data: dict[str, Any]) -> SandboxNetworkPolicy:
    return SandboxNetworkPolicy.model_validate(data)


def lines(text: str) -> list[str]:
    return text.splitlines()


def verdict(table: str, dest: str, port: int = 80, proto: str = "tcp") -> str:
    """What the rendered OUTPUT chain does with a new connection to ``dest``:port,
    following jumps and RETURNs as netfilter does (the loopback, reply and neighbour
    discovery rules match no such connection)."""
    chains: dict[str, list[list[str]]] = {}
    policy_of = {}
    for line in table.splitlines():
        if line.startswith(":"):
            name, default = line[1:].split()[:2]
            policy_of[name] = default
        elif line.startswith("-A "):
            words = line.split()
            chains.setdefault(words[1], []).append(words[2:])

    def matches(words: list[str]) -> bool:
        opts = dict(zip(words[::2], words[1::2], strict=False))
        if {"-o", "-s", "--ctstate", "--icmpv6-type"} & set(opts):
            return False
        if "-d" in opts and ipaddress.ip_address(dest) not in ipaddress.ip_network(opts["-d"]):
            return False
        if "-p" in opts and opts["-p"] != proto:
            return False
        return "--dport" not in opts or int(opts["--dport"]) == port

    def walk(chain: str) -> str | None:
        for words in chains.get(chain, []):
            if not matches(words):
                continue
            target = words[words.index("-j") + 1]
            if target == "RETURN":
                return None
            if target in ("ACCEPT", "REJECT", "DROP"):
                return target
            found = walk(target)
            if found is not None:
                return found
        return None

    return walk("OUTPUT") or policy_of["OUTPUT"]


def test_the_default_refuses_link_local_cgnat_private_ranges_and_the_node() -> None:
    rules = lines(render_rulesets(policy({}), ClusterDefault(), NODE).ipv4)
    assert rules[:4] == [
        "*filter",
        ":INPUT DROP [0:0]",
        ":FORWARD DROP [0:0]",
        ":OUTPUT ACCEPT [0:0]",
    ]
    for cidr in ("169.254.0.0/16", "100.64.0.0/10", "10.0.0.0/8", "172.16.0.0/12"):
        assert f"-A SL-CLUSTER -d {cidr} -j REJECT" in rules
    for addr in ("192.0.2.10", "10.77.0.1"):
        assert f"-A SL-CLUSTER -d {addr}/32 -j REJECT" in rules
        assert f"-A INPUT -s {addr}/32 -j ACCEPT" in rules  # the node's routing and probes
    assert "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT" in rules
    assert rules[-1] == "COMMIT"
    inputs = [r for r in rules if r.startswith("-A INPUT")]
    assert inputs == [
        "-A INPUT -i lo -j ACCEPT",
        "-A INPUT -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT",
        "-A INPUT -s 192.0.2.10/32 -j ACCEPT",
        "-A INPUT -s 10.77.0.1/32 -j ACCEPT",
    ], "ingress beyond the node's own and replies"
    table = "\n".join(rules)
    for dest in ("169.254.169.254", "100.100.100.200", "192.168.1.1", "192.0.2.10"):
        assert verdict(table, dest) == "REJECT", dest
    assert verdict(table, "203.0.113.7") == "ACCEPT"


def test_the_ipv6_table_refuses_link_local_and_unique_local_but_keeps_neighbour_discovery() -> None:
    rules = lines(render_rulesets(policy({}), ClusterDefault(), NODE).ipv6)
    assert "-A SL-CLUSTER -d fe80::/10 -j REJECT" in rules
    assert "-A SL-CLUSTER -d fc00::/7 -j REJECT" in rules
    assert "-A SL-CLUSTER -d fe80::1/128 -j REJECT" in rules
    ndp = rules.index("-A OUTPUT -p ipv6-icmp -m icmp6 --icmpv6-type 135 -j ACCEPT")
    assert ndp < rules.index("-A OUTPUT -j SL-CLUSTER")
    assert not [r for r in rules if "10.0.0.0/8" in r or "192.0.2.10" in r]


CLUSTER = ClusterDefault(
    cluster_ranges=("10.96.0.0/12", "10.77.0.0/24"),  # services; the sandbox's own network
    allowed_egress=("10.96.0.10/32",),  # cluster DNS
)


@pytest.mark.parametrize(
    ("cidr", "dest", "port"),
    [
        ("169.254.169.254/32", "169.254.169.254", 80),
        ("169.254.0.0/16", "169.254.169.254", 80),
        ("100.100.100.200/32", "100.100.100.200", 80),
        ("0.0.0.0/0", "169.254.169.254", 80),
        ("10.96.0.1/32", "10.96.0.1", 443),
        ("192.0.2.10/32", "192.0.2.10", 10250),
        ("10.77.0.1/32", "10.77.0.1", 10250),
        ("10.77.0.0/24", "10.77.0.9", 8080),
        ("192.168.0.0/16", "192.168.4.4", 5432),
        ("fe80::/10", "fe80::a9fe:a9fe", 80),
    ],
    ids=[
        "metadata",
        "link-local",
        "cgnat-metadata",
        "everywhere-still-not-metadata",
        "api-server-service",
        "node-kubelet",
        "node-on-the-bridge",
        "other-sandboxes",
        "rfc1918",
        "ipv6-link-local",
    ],
)
def test_a_tenants_egress_rule_never_opens_what_the_cluster_blocks(
    cidr: str, dest: str, port: int
) -> None:
    p = policy({"egress": [{"to": [{"ipBlock": {"cidr": cidr}}]}]})
    out = render_rulesets(p, CLUSTER, NODE)
    table = out.ipv6 if ":" in dest else out.ipv4
    assert verdict(table, dest, port) == "REJECT", lines(table)


@pytest.mark.parametrize(
    ("data", "dest", "port", "expected"),
    [
        ({}, "203.0.113.7", 443, "ACCEPT"),
        ({}, "10.96.0.10", 53, "ACCEPT"),
        ({"egress": []}, "203.0.113.7", 443, "REJECT"),
        ({"egress": [{"ports": [{"port": 443}]}]}, "203.0.113.7", 443, "ACCEPT"),
        ({"egress": [{"ports": [{"port": 443}]}]}, "203.0.113.7", 80, "REJECT"),
        (
            {"egress": [{"to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]}]},
            "198.51.100.5",
            80,
            "ACCEPT",
        ),
        (
            {"egress": [{"to": [{"ipBlock": {"cidr": "198.51.100.0/24"}}]}]},
            "203.0.113.7",
            80,
            "REJECT",
        ),
        (
            {
                "egress": [
                    {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["198.51.100.0/24"]}}]}
                ]
            },
            "198.51.100.5",
            80,
            "REJECT",
        ),
        ({"egress": [{"ports": [{"port": 443}]}]}, "10.96.0.10", 53, "REJECT"),
        (
            {"egress": [{"to": [{"ipBlock": {"cidr": "10.96.0.10/32"}}]}]},
            "10.96.0.10",
            53,
            "ACCEPT",
        ),
    ],
    ids=[
        "unset-the-internet",
        "unset-the-clusters-opening",
        "empty-nothing",
        "port-rule-its-port",
        "port-rule-other-port",
        "block-inside",
        "block-outside",
        "except",
        "narrowed-away-the-clusters-opening",
        "kept-the-clusters-opening",
    ],
)
def test_a_tenants_egress_rules_only_narrow_what_the_cluster_allows(
    data: dict[str, Any], dest: str, port: int, expected: str
) -> None:
    table = render_rulesets(policy(data), CLUSTER, NODE).ipv4
    assert verdict(table, dest, port) == expected, lines(table)


def test_the_clusters_allowed_egress_is_the_only_opening_into_its_blocks() -> None:
    rules = lines(render_rulesets(policy({}), CLUSTER, NODE).ipv4)
    opening = rules.index("-A SL-CLUSTER -d 10.96.0.10/32 -j RETURN")
    refusals = [i for i, r in enumerate(rules) if r.startswith("-A SL-CLUSTER") and "REJECT" in r]
    assert refusals and opening < min(refusals)
    assert "-A SL-CLUSTER -d 10.96.0.0/12 -j REJECT" in rules


def test_the_cluster_chain_comes_before_every_tenant_rule() -> None:
    p = policy(
        {"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}, {"ports": [{"port": 1}]}]}
    )
    rules = lines(render_rulesets(p, CLUSTER, NODE).ipv4)
    cluster = rules.index("-A OUTPUT -j SL-CLUSTER")
    tenant = [i for i, r in enumerate(rules) if r.startswith("-A OUTPUT") and i != cluster]
    tenant = [i for i in tenant if "SL-OUT" in rules[i] or "--dport" in rules[i]]
    assert tenant and cluster < min(tenant)
    assert rules[-2] == "-A OUTPUT -j REJECT"


def test_the_default_blocked_ranges_hold_cgnat() -> None:
    settings = AgentSettings(node_name="n")
    assert "100.64.0.0/10" in settings.blocked_egress
    assert "100.64.0.0/10" in ClusterDefault().blocked


@pytest.mark.parametrize(
    ("peers", "let_in"),
    [
        ([Peer({"role": "client"}, "10.77.0.5")], ["10.77.0.5"]),
        ([Peer({"role": "other"}, "10.77.0.6")], []),
        ([Peer({"role": "client"}, "10.77.0.5"), Peer({}, "10.77.0.7")], ["10.77.0.5"]),
    ],
    ids=["selected", "not-selected", "only-the-selected-of-two"],
)
def test_an_ingress_selector_lets_in_exactly_the_peers_it_matches(
    peers: list[Peer], let_in: list[str]
) -> None:
    p = policy(
        {
            "ingress": [
                {
                    "from": [{"sandboxSelector": {"matchLabels": {"role": "client"}}}],
                    "ports": [{"port": 8080, "protocol": "TCP"}],
                }
            ]
        }
    )
    out = render_rulesets(p, ClusterDefault(), NODE, peers)
    assert list(out.peers) == let_in
    accepted = [r for r in lines(out.ipv4) if "--dport 8080" in r]
    assert accepted == [
        f"-A INPUT -s {ip}/32 -p tcp -m tcp --dport 8080 -j ACCEPT" for ip in let_in
    ]


def test_an_ingress_rule_without_sources_admits_any_source_on_its_ports() -> None:
    p = policy({"ingress": [{"ports": [{"port": 53, "protocol": "UDP"}]}]})
    rules = lines(render_rulesets(p, ClusterDefault(), NODE).ipv4)
    assert "-A INPUT -p udp -m udp --dport 53 -j ACCEPT" in rules


def test_an_ip_block_of_the_other_family_adds_nothing_to_this_one() -> None:
    p = policy({"ingress": [{"from": [{"ipBlock": {"cidr": "2001:db8::/32"}}]}]})
    out = render_rulesets(p, ClusterDefault(), NODE)
    assert "2001:db8" not in out.ipv4
    assert "-A SL-IN-0-0 -s 2001:db8::/32 -j ACCEPT" in lines(out.ipv6)


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        ({}, {"a": "b"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "b", "c": "d"}, True),
        ({"matchLabels": {"a": "b"}}, {"a": "c"}, False),
        (
            {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b", "c"]}]},
            {"a": "c"},
            True,
        ),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["b"]}]}, {}, True),
        ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ],
    ids=["empty", "labels", "labels-differ", "in", "notin-absent", "exists", "doesnotexist"],
)
def test_selectors_follow_kubernetes_label_selector_semantics(
    selector: dict[str, Any], labels: dict[str, str], matches: bool
) -> None:
    assert selector_matches(LabelSelector.model_validate(selector), labels) is matches


def test_a_selector_becomes_the_api_servers_label_selector() -> None:
    s = LabelSelector.model_validate(
        {
            "matchLabels": {"role": "client"},
            "matchExpressions": [
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
                {"key": "x", "operator": "DoesNotExist"},
            ],
        }
    )
    assert selector_string(s) == "role=client,tier in (a,b),!x"


def test_a_sandboxs_own_ingress_and_egress_each_win_over_the_namespaces() -> None:
    ns = parse_namespace_default(
        '{"ingress": [{"ports": [{"port": 1}]}], "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]}',
        "team",
    )
    own = policy({"ingress": []})
    merged = effective(own, ns)
    assert merged.ingress == []
    assert ns is not None and merged.egress == ns.egress
    assert effective(None, None) == SandboxNetworkPolicy()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{", "not JSON"),
        ('{"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.1/8"}}]}]}', "10.0.0.1/8"),
    ],
    ids=["not-json", "host-bits"],
)
def test_a_bad_namespace_default_is_refused_naming_the_annotation(text: str, named: str) -> None:
    with pytest.raises(ValueError, match=r"sandlot\.dev/default-network-policy") as caught:
        parse_namespace_default(text, "team")
    assert named in str(caught.value)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ({"egress": [{"to": [{"ipBlock": {"cidr": "not-a-cidr"}}]}]}, "ipBlock.cidr"),
        (
            {"egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.1.0.0/24"]}}]}]},
            "ipBlock.except[0]",
        ),
        ({"ingress": [{"from": [{}]}]}, "exactly one of sandboxSelector and ipBlock"),
        ({"ingress": [{"ports": [{"port": 0}]}]}, "port"),
        (
            {
                "ingress": [
                    {
                        "from": [
                            {
                                "sandboxSelector": {
                                    "matchExpressions": [{"key": "a", "operator": "In"}]
                                }
                            }
                        ]
                    }
                ]
            },
            "In on a needs values",
        ),
    ],
    ids=["cidr", "except-outside", "no-peer", "port-zero", "in-without-values"],
)
def test_a_bad_policy_is_refused_naming_the_field(data: dict[str, Any], named: str) -> None:
    with pytest.raises(ValidationError, match="networkPolicy") as caught:
        SandboxSpec.model_validate({"image": "x", "networkPolicy": data})
    assert named in str(caught.value)


def test_ports_the_node_serves_are_refused_at_the_nodes_address() -> None:
    ports = [SandboxPort(container_port=8080), SandboxPort(container_port=10250)]
    refusal = reserved_port_refusal(ports, {10250, 9090})
    assert refusal is not None and "10250" in refusal and "8080" not in refusal
    assert reserved_port_refusal([SandboxPort(container_port=8080)], {10250}) is None


def test_the_agents_own_ports_are_reserved_and_bad_ranges_refused_at_start() -> None:
    settings = AgentSettings(node_name="n", metrics_port=9090)
    assert {9090, 10250, 6443} <= settings.node_ports
    with pytest.raises(ValidationError, match=r"cluster_cidrs\[1\]"):
        AgentSettings(node_name="n", cluster_cidrs=["10.96.0.0/12", "10.244.0.1/16"])


def test_published_ports_are_open_while_no_ingress_rules_are_set() -> None:
    ports = [SandboxPort(container_port=8080), SandboxPort(container_port=53, protocol="UDP")]
    open_ = lines(render_rulesets(policy({}), ClusterDefault(), NODE, published=ports).ipv4)
    assert "-A INPUT -p tcp -m tcp --dport 8080 -j ACCEPT" in open_
    assert "-A INPUT -p udp -m udp --dport 53 -j ACCEPT" in open_
    ruled = render_rulesets(policy({"ingress": []}), ClusterDefault(), NODE, published=ports)
    assert "--dport" not in ruled.ipv4, "its own rules (even none) replace the opening"
