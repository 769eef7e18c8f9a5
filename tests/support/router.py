"""The stream rig of ``tests/support/streams.py`` with the gateway's router on
(agent-sandbox's protocol, ``router.sandlot.dev``), callers granted the router's
subresources as the chart's edit role grants them, and ``Router``: the requests
agent-sandbox's client sends, as one user, through the API server.

Fixtures, imported by name into a test module: ``gateway`` and ``agent`` (module;
they replace the streams' own: the agent's sandboxes on the node's loopback, whatever
CNI configuration the host has, since no test here is about networking),
``router_users`` (module)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from kubernetes import client

from sandlot.agent.main import Agent
from sandlot.devtools.certs import StreamCerts
from sandlot.devtools.gatewayrig import running_gateway
from sandlot.devtools.streamnet import StreamAddress
from sandlot.gateway.runner import GatewayParts
from sandlot.policy.router import ROUTER_GROUP, api_url
from tests.support.streams import StartStreamAgent, _grant

ROUTER_RULES = [
    {
        "apiGroups": [ROUTER_GROUP],
        "resources": [
            f"routers/{op}" for op in ("execute", "upload", "download", "list", "exists")
        ],
        "verbs": ["get", "create"],
    }
]


@pytest.fixture(scope="module")
def gateway(
    kube: client.ApiClient,
    places: tuple[str, str],
    stream_address: StreamAddress,
    stream_certs: StreamCerts,
) -> Iterator[GatewayParts]:
    system, _ = places
    with running_gateway(
        kube,
        stream_certs,
        system,
        stream_address.ip,
        call_timeout="30s",
        router=True,
        router_port=0,
    ) as parts:
        yield parts


AGENT_SANDBOX_RULES = [
    {
        "apiGroups": ["extensions.agents.x-k8s.io"],
        "resources": ["sandboxtemplates", "sandboxwarmpools", "sandboxclaims"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {
        "apiGroups": ["agents.x-k8s.io"],
        "resources": ["sandboxes"],
        "verbs": ["get", "list", "watch"],
    },
]


def user_of(kubeconfig: Path) -> tuple[str, str, str]:
    """(API server URL, its CA file, the user's bearer token) of a rig kubeconfig."""
    config = yaml.safe_load(kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    return cluster["server"], cluster["certificate-authority"], config["users"][0]["user"]["token"]


@pytest.fixture(scope="module")
def agent(start_stream_agent: StartStreamAgent) -> Agent:
    return start_stream_agent("router", handshake_timeout=30.0, network_mode="host-address")


class Router:
    """agent-sandbox's client's requests, as one user, through the API server."""

    def __init__(self, kubeconfig: Path, namespace: str, sandbox: str) -> None:
        server, ca, token = user_of(kubeconfig)
        self.url = api_url(server, namespace)
        self.session = requests.Session()
        self.session.trust_env = False  # REQUESTS_CA_BUNDLE would win over verify
        self.session.verify = ca
        self.session.headers.update(
            {
                "Authorization": f"Bearer {token}",
                "X-Sandbox-ID": sandbox,
                "X-Sandbox-Namespace": namespace,
                "X-Sandbox-Port": "8888",
            }
        )

    def execute(self, command: str, **more: Any) -> requests.Response:
        body = {"command": command, **more}
        return self.session.post(f"{self.url}/execute", json=body, timeout=60)

    def get(self, op: str, path: str) -> requests.Response:
        quoted = urllib.parse.quote(path, safe="")
        return self.session.get(f"{self.url}/{op}/{quoted}", timeout=60, allow_redirects=False)

    def upload(self, name: str, data: bytes) -> requests.Response:
        return self.session.post(f"{self.url}/upload", files={"file": (name, data)}, timeout=60)


@pytest.fixture(scope="module")
def router_users(
    kube: client.ApiClient, places: tuple[str, str], users: dict[str, Path]
) -> dict[str, Path]:
    """The streams' users, ``operator-person`` also with what the chart's edit role
    grants of agent-sandbox's objects, both with the router's subresources."""
    _, tenant = places
    for user in ("operator-person", "onlooker"):
        _grant(kube, tenant, f"{user}-router", ROUTER_RULES, (tenant, user))
    _grant(
        kube,
        tenant,
        "operator-person-agent-sandbox",
        AGENT_SANDBOX_RULES,
        (tenant, "operator-person"),
    )
    return users
