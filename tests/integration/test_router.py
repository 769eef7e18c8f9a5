"""agent-sandbox's router protocol served by the gateway, end to end: a user's own
credentials at the real API server, which proxies ``router.sandlot.dev`` to a real
gateway, which reaches a real agent and a real containerd sandbox. Each call is
reviewed for the sandbox as exec and files are: a user who may not exec into it
gets nothing through the router either.

The fixtures are those of ``tests/support/streams.py``, with the gateway's router on.
"""

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
from tests.support.streams import running_sandbox
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

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


class Router:
    """agent-sandbox's client's requests, as one user, through the API server."""

    def __init__(self, kubeconfig: Path, namespace: str, sandbox: str) -> None:
        config = yaml.safe_load(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        self.url = api_url(cluster["server"], namespace)
        self.session = requests.Session()
        self.session.trust_env = False  # REQUESTS_CA_BUNDLE would win over verify
        self.session.verify = cluster["certificate-authority"]
        self.session.headers.update(
            {
                "Authorization": f"Bearer {config['users'][0]['user']['token']}",
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
    from tests.support.streams import _grant

    _, tenant = places
    for user in ("operator-person", "onlooker"):
        _grant(kube, tenant, f"{user}-router", ROUTER_RULES, (tenant, user))
    return users


def test_commands_and_files_through_the_router_on_the_users_own_credentials(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    router_users: dict[str, Path],
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "routed", "sleep 1000")
    router = Router(router_users["operator-person"], tenant, "routed")

    answer = router.execute("echo out; echo err >&2; exit 3")
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "stdout": "out\n",
        "stderr": "err\n",
        "exit_code": 3,
        "timed_out": False,
    }

    timed = router.execute("sleep 30", timeout_seconds=0.5).json()
    assert (timed["exit_code"], timed["timed_out"]) == (124, True)

    assert router.upload("made/here/a.txt", b"hello\n").status_code == 200
    assert router.execute("cat made/here/a.txt").json()["stdout"] == "hello\n"
    download = router.get("download", "made/here/a.txt")
    assert (download.status_code, download.content) == (200, b"hello\n")
    assert router.get("download", "made/nothing.txt").status_code == 404

    listed = router.get("list", "made/here").json()
    assert [(e["name"], e["type"], e["size"]) for e in listed] == [("a.txt", "file", 6)]
    assert isinstance(listed[0]["mod_time"], float)
    top = {e["name"]: e["type"] for e in router.get("list", ".").json()}
    assert top.get("made") == "directory", top

    assert router.get("exists", "made/here/a.txt").json() == {
        "path": "made/here/a.txt",
        "exists": True,
    }
    missing = router.get("exists", "nope")
    assert (missing.status_code, missing.json()["exists"]) == (200, False)


def test_nobody_reaches_a_sandbox_through_the_router_they_could_not_exec_into(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    router_users: dict[str, Path],
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "guarded", "sleep 1000")
    onlooker = Router(router_users["onlooker"], tenant, "guarded")
    refused = onlooker.execute("echo pwned > /tmp/p")
    assert refused.status_code == 403, refused.text
    assert onlooker.get("download", "/etc/hostname").status_code == 403
    assert onlooker.upload("x.txt", b"x").status_code == 403
    owner = Router(router_users["operator-person"], tenant, "guarded")
    wait_for(
        lambda: owner.get("exists", "/tmp/p").json() == {"path": "/tmp/p", "exists": False},
        timeout=10,
        what="the refused command to have written nothing",
    )
    # The URL's namespace is what the API server authorised: a header naming another
    # namespace is refused, not followed.
    other = owner.session.post(
        f"{owner.url}/execute",
        json={"command": "true"},
        headers={"X-Sandbox-Namespace": "kube-system"},
        timeout=30,
    )
    assert other.status_code == 400, other.text
