"""agent-sandbox's router protocol served by the gateway, end to end: a user's own
credentials at the real API server, which proxies ``router.sandlot.dev`` to a real
gateway, which reaches a real agent and a real containerd sandbox. Each call is
reviewed for the sandbox as exec and files are: a user who may not exec into it
gets nothing through the router either.

The fixtures are those of ``tests/support/streams.py``, with the gateway's router on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes import client

from sandlot.agent.main import Agent
from tests.support.router import Router, agent, gateway, router_users
from tests.support.streams import running_sandbox, sandlot
from tests.support.wait import wait_for

__all__ = ["agent", "gateway", "router_users"]  # fixtures

pytestmark = [pytest.mark.containerd, pytest.mark.integration]


def test_commands_and_files_through_the_router_on_the_users_own_credentials(
    kube: client.ApiClient,
    agent: Agent,
    places: tuple[str, str],
    router_users: dict[str, Path],
) -> None:
    _, tenant = places
    running_sandbox(kube, agent, tenant, "routed", "sleep 1000")
    router = Router(router_users["operator-person"], tenant, "routed")
    printed = sandlot("router-url", "-n", tenant, kubeconfig=router_users["operator-person"])
    assert printed.stdout.strip() == router.url, printed.stderr

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
