"""Sandboxes' network policy, for real: the CNI bridge of ``test_cni``, real agents on
the test containerd, the filter installed in each sandbox's namespace before its
process starts.

Every address a sandbox is sent to is on the test's bridge, on this host, or in a
network namespace this module creates ("outside": stand-in metadata servers on a
link-local and a CGNAT address and a stand-in internet server on a TEST-NET-3
address, routed through this host). A prober sandbox waits for a list of targets the
test writes into its root filesystem (through ``/proc/<pid>/root``), tries each a few
times with a timeout, and writes what it saw next to it: bounded in count and time.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import DEFAULT_NETWORK_POLICY_ANNOTATION
from tests.integration import test_cni as cni
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

# The CNI tests' bridge, image and harness (pytest finds fixtures by name).
network = cni.network
archive = cni.archive
harness = cni.harness

PORT = 8080
# Waits for /targets, tries each "name host port" line up to 3 times (an HTTP GET
# through nc, 5 s each: the image's static wget cannot run), writes "name ok" or
# "name refused" lines to /results, then idles until stopped.
PROBER = [
    "sh",
    "-c",
    "while [ ! -s /targets ]; do sleep 0.2; done; "
    "while read name host port; do r=refused; for i in 1 2 3; do "
    'out=$(printf "GET / HTTP/1.0\\r\\n\\r\\n" | busybox nc -w 5 "$host" "$port" 2>>/errors); '
    'case "$out" in *" 200 "*) r=ok; break;; esac; done; '
    'echo "$name $r"; done < /targets > /results.part; busybox mv /results.part /results; '
    'trap "exit 143" TERM; sleep 1000 & wait',
]
DEADLINE = 90.0


@dataclass(frozen=True)
class Outside:
    """A network namespace beyond the node: the stand-ins answer on ``PORT``."""

    metadata: str  # link-local, like 169.254.169.254
    cgnat: str  # shared address space, like one cloud's 100.100.100.200
    internet: str  # TEST-NET-3, a public address that leaves nothing

    @property
    def addresses(self) -> tuple[str, ...]:
        return (self.metadata, self.cgnat, self.internet)


def _ip(*args: str, netns: str | None = None) -> None:
    argv = ["ip", *(("-n", netns) if netns else ()), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    assert proc.returncode == 0, f"{' '.join(argv)}: {proc.stderr.strip()}"


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outside]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 is missing")
    n = os.getpid() % 250
    ns, host_if, ns_if = f"slout{n}", f"slo{n}h", f"slo{n}n"
    transit = ipaddress.IPv4Network(f"10.79.{n}.0/30")
    gw, far = (str(a) for a in list(transit.hosts())[:2])
    found = Outside(
        metadata=f"169.254.{n}.254", cgnat=f"100.64.{n}.254", internet=f"203.0.113.{n + 1}"
    )
    www = tmp_path_factory.mktemp("outside")
    (www / "index.html").write_text("outside\n")
    server: subprocess.Popen[bytes] | None = None
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False, timeout=10)
    subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False, timeout=10)
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", ns)
        _ip("addr", "add", f"{gw}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("link", "set", "lo", "up", netns=ns)
        _ip("addr", "add", f"{far}/30", "dev", ns_if, netns=ns)
        _ip("link", "set", ns_if, "up", netns=ns)
        for addr in found.addresses:
            _ip("addr", "add", f"{addr}/32", "dev", "lo", netns=ns)
            _ip("route", "add", f"{addr}/32", "via", far)
        _ip("route", "add", "default", "via", gw, netns=ns)
        server = subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, "-m", "http.server", str(PORT)],
            cwd=www,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        yield found
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
        for addr in found.addresses:
            subprocess.run(["ip", "route", "del", f"{addr}/32"], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@pytest.fixture
def node_server() -> Iterator[int]:
    """A server on every address of this host (the node): its port."""

    class Quiet(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"node\n")

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def create(
    h: cni.Harness,
    name: str,
    node: cni.Node,
    command: list[str],
    *,
    labels: dict[str, str] | None = None,
    policy: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    spec: dict[str, Any] = {
        "image": cni.IMAGE,
        "nodeName": node.name,
        "command": command,
        "terminationGracePeriodSeconds": 1,
        **(extra or {}),
    }
    if policy is not None:
        spec["networkPolicy"] = policy
    h.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        h.namespace,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": spec,
        },
    )


def sandboxes_may_meet(h: cni.Harness) -> tuple[str, ...]:
    """The cluster's opening (``allowed_egress``) for traffic between sandboxes: the
    bridge's subnet but the node's own address on it (the gateway). No tenant's rule
    opens the sandboxes' own network; their ingress rules decide who gets in."""
    gateway = ipaddress.IPv4Network(f"{next(h.net.subnet.hosts())}/32")
    return tuple(str(n) for n in h.net.subnet.address_exclude(gateway))


def running(h: cni.Harness, name: str) -> dict[str, Any]:
    def up() -> dict[str, Any] | None:
        sb = h.get(name)
        assert cni.phase(sb) not in cni.TERMINAL, f"{name} ended: {sb.get('status')}"
        return sb if cni.phase(sb) == "Running" and cni.status(sb, "ip") else None

    return wait_for(up, timeout=DEADLINE, what=f"sandbox {name} to run with an address")


def probe(h: cni.Harness, name: str, targets: dict[str, str]) -> dict[str, str]:
    """Hand the prober sandbox ``name`` its targets; what it saw of each."""
    root = Path(f"/proc/{cni.status(running(h, name), 'pid')}/root")
    (root / "targets").write_text("".join(f"{k} {v}\n" for k, v in targets.items()))

    def results() -> dict[str, str] | None:
        with contextlib.suppress(FileNotFoundError):
            lines = (root / "results").read_text().split()
            return dict(zip(lines[::2], lines[1::2], strict=True))
        return None

    seen = wait_for(results, timeout=DEADLINE, what=f"{name}'s probes of {sorted(targets)}")
    with contextlib.suppress(FileNotFoundError):
        print(f"{name}'s nc said:", (root / "errors").read_text())
    return seen


def test_the_default_policy_keeps_a_sandbox_to_the_internet(
    harness: cni.Harness, outside: Outside, node_server: int
) -> None:
    node = harness.add_node("a")
    create(harness, "victim", node, cni.HTTPD, labels={"tenant": "b"})
    victim_ip = cni.status(running(harness, "victim"), "ip")
    # The node's routing reaches it (its Services, its probes): only the node.
    assert cni.fetch(victim_ip) == "hello-victim"
    gateway = str(next(harness.net.subnet.hosts()))
    create(harness, "prober", node, PROBER, labels={"tenant": "a"})
    seen = probe(
        harness,
        "prober",
        {
            "internet": f"{outside.internet} {PORT}",
            "metadata": f"{outside.metadata} {PORT}",
            "cgnat": f"{outside.cgnat} {PORT}",
            "node": f"{gateway} {node_server}",
            "neighbour": f"{victim_ip} 8080",
        },
    )
    assert seen == {
        "internet": "ok",
        "metadata": "refused",
        "cgnat": "refused",
        "node": "refused",
        "neighbour": "refused",
    }, f"what the prober reached under the default policy: {seen}"


def test_a_tenants_rule_cannot_open_what_the_cluster_blocks(
    harness: cni.Harness, outside: Outside, node_server: int
) -> None:
    """The cluster's blocks stand above a tenant's rules: an egress rule naming the
    metadata addresses, the node and the sandboxes' network opens none of them. The
    rule is in force (it narrows: only what it names that the cluster allows, the
    internet stand-in, is reached)."""
    node = harness.add_node("a")
    published = {"ports": [{"name": "http", "containerPort": 8080}]}
    create(harness, "neighbour", node, cni.HTTPD, extra=published)  # open to any source
    neighbour_ip = cni.status(running(harness, "neighbour"), "ip")
    assert cni.fetch(neighbour_ip) == "hello-neighbour"  # it serves: the node reaches it
    gateway = str(next(harness.net.subnet.hosts()))
    cidrs = [
        f"{outside.metadata}/32",
        f"{outside.cgnat}/32",
        f"{gateway}/32",
        str(harness.net.subnet),
        f"{outside.internet}/32",
    ]
    opening = {"egress": [{"to": [{"ipBlock": {"cidr": c}} for c in cidrs]}]}
    create(harness, "prober", node, PROBER, policy=opening)
    seen = probe(
        harness,
        "prober",
        {
            "internet": f"{outside.internet} {PORT}",
            "metadata": f"{outside.metadata} {PORT}",
            "cgnat": f"{outside.cgnat} {PORT}",
            "node": f"{gateway} {node_server}",
            "neighbour": f"{neighbour_ip} 8080",
        },
    )
    assert seen == {
        "internet": "ok",
        "metadata": "refused",
        "cgnat": "refused",
        "node": "refused",
        "neighbour": "refused",
    }, f"what a rule naming the cluster's blocked ranges reached: {seen}"


def test_an_ingress_rule_lets_in_only_the_sandboxes_it_selects(harness: cni.Harness) -> None:
    node = harness.add_node("a", allowed_egress=sandboxes_may_meet(harness))
    subnet = str(harness.net.subnet)
    to_subnet = {"egress": [{"to": [{"ipBlock": {"cidr": subnet}}], "ports": [{"port": 8080}]}]}
    create(harness, "client", node, PROBER, labels={"role": "client"}, policy=to_subnet)
    create(harness, "other", node, PROBER, labels={"role": "other"}, policy=to_subnet)
    running(harness, "client")
    running(harness, "other")
    admit_clients = {
        "ingress": [
            {
                "from": [{"sandboxSelector": {"matchLabels": {"role": "client"}}}],
                "ports": [{"port": 8080}],
            }
        ]
    }
    create(harness, "server", node, cni.HTTPD, labels={"role": "server"}, policy=admit_clients)
    url = f"{cni.status(running(harness, 'server'), 'ip')} 8080"
    assert probe(harness, "client", {"server": url}) == {"server": "ok"}
    assert probe(harness, "other", {"server": url}) == {"server": "refused"}


def test_the_ports_a_sandbox_publishes_are_open_until_it_sets_ingress_rules(
    harness: cni.Harness,
) -> None:
    """A pool Service's clients arrive with their own addresses (kube-proxy keeps
    them): the ports a sandbox publishes are open while no ingress rules are set."""
    node = harness.add_node("a", allowed_egress=sandboxes_may_meet(harness))
    subnet = str(harness.net.subnet)
    to_subnet = {"egress": [{"to": [{"ipBlock": {"cidr": subnet}}], "ports": [{"port": 8080}]}]}
    create(harness, "client", node, PROBER, policy=to_subnet)
    published = {"ports": [{"name": "http", "containerPort": 8080}]}
    create(harness, "served", node, cni.HTTPD, extra=published)
    closed = {"ingress": [{"from": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]}]}
    create(harness, "ruled", node, cni.HTTPD, policy=closed, extra=published)
    targets = {
        name: f"{cni.status(running(harness, name), 'ip')} 8080" for name in ("served", "ruled")
    }
    assert probe(harness, "client", targets) == {"served": "ok", "ruled": "refused"}


def test_a_peer_that_starts_later_is_let_in_once_the_filter_is_rendered_again(
    harness: cni.Harness,
) -> None:
    node = harness.add_node("a", allowed_egress=sandboxes_may_meet(harness))
    assert node.agent is not None
    admit_clients = {
        "ingress": [{"from": [{"sandboxSelector": {"matchLabels": {"role": "client"}}}]}]
    }
    create(harness, "server", node, cni.HTTPD, labels={"role": "server"}, policy=admit_clients)
    url = f"{cni.status(running(harness, 'server'), 'ip')} 8080"
    subnet = str(harness.net.subnet)
    to_subnet = {"egress": [{"to": [{"ipBlock": {"cidr": subnet}}]}]}
    create(harness, "client", node, PROBER, labels={"role": "client"}, policy=to_subnet)
    running(harness, "client")
    registry = node.agent.registry

    def rendered_again() -> bool:
        sample = registry.get_sample_value(
            "sandlot_agent_network_policy_installs_total", {"trigger": "peers"}
        )
        return bool(sample)

    wait_for(rendered_again, timeout=DEADLINE, what="the server's filter rendered again")
    assert probe(harness, "client", {"server": url}) == {"server": "ok"}


def test_a_namespace_default_stands_in_for_a_sandboxs_missing_rules(
    harness: cni.Harness,
) -> None:
    node = harness.add_node("a", allowed_egress=sandboxes_may_meet(harness))
    subnet = str(harness.net.subnet)
    default = {
        "ingress": [{"ports": [{"port": 8080}]}],
        "egress": [{"to": [{"ipBlock": {"cidr": subnet}}], "ports": [{"port": 8080}]}],
    }
    core = client.CoreV1Api(harness.kube)

    def annotate(value: str) -> None:
        core.patch_namespace(
            harness.namespace,
            {"metadata": {"annotations": {DEFAULT_NETWORK_POLICY_ANNOTATION: value}}},
        )

    annotate(json.dumps(default))
    create(harness, "server", node, cni.HTTPD)
    create(harness, "client", node, PROBER)
    # Its own (empty) egress wins over the namespace's.
    create(harness, "confined", node, PROBER, policy={"egress": []})
    target = {"server": f"{cni.status(running(harness, 'server'), 'ip')} 8080"}
    assert probe(harness, "client", target) == {"server": "ok"}
    assert probe(harness, "confined", target) == {"server": "refused"}

    annotate("{not json")
    create(harness, "misled", node, PROBER)

    def ended() -> dict[str, Any] | None:
        status = harness.get("misled").get("status") or {}
        return status if status.get("phase") in (*cni.TERMINAL, "Running") else None

    status = wait_for(ended, timeout=DEADLINE, what="the sandbox under a bad annotation to end")
    assert status["phase"] == "Failed", status
    assert status["reason"] == "InvalidNetworkPolicy", status
    assert DEFAULT_NETWORK_POLICY_ANNOTATION in status["message"], status
