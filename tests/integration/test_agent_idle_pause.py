"""Idle auto-pause, end to end: the CLI, the real API server, the stream gateway,
an agent sampling every 0.3 s and the real containerd.

A sandbox with ``spec.idleTimeoutSeconds`` and nothing to do is frozen by its
agent after that long (the cgroup freezer says so) with the spec still Running,
its ``Paused`` condition ``Idle`` and an Event; an exec then resumes it and runs.
An exec session held open keeps a quiet sandbox from pausing until it ends. The
rig is ``tests/support/streams.py``'s; only the agent here is its own.

With ``paused_streams: Resume`` a sandbox paused by its spec is thawed for an
exec and frozen again once the exec ends (the default, Refuse, is
``test_agent_pause``'s).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.runtime import TaskState
from sandlot.agent.main import Agent
from sandlot.api.common import GROUP, VERSION
from sandlot.api.keys import CLAIM_LABEL, POOL_LABEL, SANDBOX_LABEL
from tests.integration.test_agent_node import get_sandbox
from tests.integration.test_agent_pause import frozen, paused_condition, watch_says
from tests.support.streams import (
    StartStreamAgent,
    delete_sandbox,
    running_sandbox,
    sandlot,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.containerd, pytest.mark.integration]

IDLE_TIMEOUT = 2  # seconds, the sandboxes' spec.idleTimeoutSeconds
IDLE_SPEC = {"spec": {"idleTimeoutSeconds": IDLE_TIMEOUT}}


@pytest.fixture(scope="module")
def agent(start_stream_agent: StartStreamAgent) -> Agent:
    """The stream rig's agent, sampling idleness every 0.3 s, thawing a sandbox
    paused by its spec for a stream (``paused_streams: Resume``)."""
    return start_stream_agent("idlepause", idle_interval="0.3s", paused_streams="Resume")


def idle_sandbox(kube: client.ApiClient, agent: Agent, namespace: str, name: str) -> str:
    """A Running sandbox that sleeps, with an idle timeout; its container id."""
    sandbox = running_sandbox(kube, agent, namespace, name, "sleep 100000")
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name, IDLE_SPEC
    )
    return str(sandbox["status"]["containerId"])


def hold_still(kube: client.ApiClient, namespace: str, name: str) -> None:
    """A long timeout from now on: once resumed, it is not paused again under the
    checks (an idle pause is resumed whatever the timeout says)."""
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "sandboxes", name, {"spec": {"idleTimeoutSeconds": 3600}}
    )


def condition_is(
    kube: client.ApiClient, namespace: str, name: str, status: str, reason: str, timeout: float
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = get_sandbox(kube, namespace, name)
        c = paused_condition(sb)
        return sb if c and (c["status"], c["reason"]) == (status, reason) else None

    return wait_for(
        probe, timeout=timeout, what=f"sandbox {name}'s Paused condition {status} ({reason})"
    )


def event_reasons(kube: client.ApiClient, namespace: str, name: str) -> list[str]:
    events = client.CoreV1Api(kube).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [e.reason or "" for e in events.items]


def idle_passes(agent: Agent) -> float:
    return agent.registry.get_sample_value("sandlot_agent_idle_passes_total") or 0


def test_an_idle_sandbox_is_paused_after_its_timeout_and_an_exec_resumes_it_and_runs(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    cid = idle_sandbox(kube, agent, tenant, "dozer")
    began = time.monotonic()
    paused = condition_is(kube, tenant, "dozer", "True", "Idle", timeout=IDLE_TIMEOUT + 20)
    assert time.monotonic() - began >= IDLE_TIMEOUT - 0.5, "paused before its idle timeout"
    assert paused["spec"]["operatingMode"] == "Running", "the spec was rewritten"
    assert paused["status"]["phase"] == "Running"
    assert frozen(agent, cid), "the condition says Idle but the cgroup is not frozen"
    task = agent.parts.runtime.get_task(cid, timeout=5)
    assert task is not None and task.state is TaskState.PAUSED
    wait_for(
        lambda: "IdlePaused" in event_reasons(kube, tenant, "dozer"),
        timeout=10,
        what="an IdlePaused Event about the sandbox",
    )
    hold_still(kube, tenant, "dozer")
    wait_for(  # the stream server decides from the agent's watch
        lambda: paused_condition(agent.sandbox_watch.get(f"{tenant}/dozer")) is not None,
        timeout=10,
        what="the agent's watch to see the idle pause",
    )

    done = sandlot(
        "exec", "dozer", "-n", tenant, "--", "echo", "awake", kubeconfig=users["operator-person"]
    )
    assert (done.returncode, done.stdout.strip()) == (0, "awake"), done.stderr
    resumed = condition_is(kube, tenant, "dozer", "False", "Resumed", timeout=10)
    c = paused_condition(resumed)
    assert c is not None and "exec" in c["message"]
    assert not frozen(agent, cid)
    assert resumed["status"]["pid"] == paused["status"]["pid"], "not the same process"
    wait_for(
        lambda: "ResumedOnUse" in event_reasons(kube, tenant, "dozer"),
        timeout=10,
        what="a ResumedOnUse Event about the sandbox",
    )
    assert agent.registry.get_sample_value("sandlot_agent_idle_resumes_total") == 1
    delete_sandbox(kube, tenant, "dozer")


def test_an_open_exec_session_keeps_a_quiet_sandbox_from_pausing_until_it_ends(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    kubeconfig = users["operator-person"]
    # The session opens before the sandbox has its idle timeout: a CLI slow to start
    # (a loaded machine) would otherwise meet a sandbox already paused and resuming.
    cid = str(
        running_sandbox(kube, agent, tenant, "reader", "sleep 100000")["status"]["containerId"]
    )
    held = 6 * IDLE_TIMEOUT  # past the watch of the timeout and the checks below
    session = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sandlot.cli.main",
            "exec",
            "--kubeconfig",
            str(kubeconfig),
            "reader",
            "-n",
            tenant,
            "--",
            "sleep",
            str(held),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: agent.streams is not None and agent.streams.sessions(f"{tenant}/reader") == 1,
            timeout=30,
            what="the exec session to open on the agent",
        )
        client.CustomObjectsApi(kube).patch_namespaced_custom_object(
            GROUP, VERSION, tenant, "sandboxes", "reader", IDLE_SPEC
        )
        wait_for(
            lambda: watch_says(
                agent,
                f"{tenant}/reader",
                lambda sb: sb.get("spec", {}).get("idleTimeoutSeconds") == IDLE_TIMEOUT,
            ),
            timeout=15,
            what="the agent's view of the sandbox to carry its idle timeout",
        )
        opened, passes = time.monotonic(), idle_passes(agent)
        while session.poll() is None and time.monotonic() - opened < 2 * IDLE_TIMEOUT:
            assert not frozen(agent, cid), "paused under an open exec session"
            time.sleep(0.2)
        assert idle_passes(agent) >= passes + 5, "the idle loop did not sample meanwhile"
        assert session.poll() is None, "the exec ended early: the session held nothing"
        c = paused_condition(get_sandbox(kube, tenant, "reader"))
        assert c is None or c["status"] == "False", f"paused under an open session: {c}"
        _, err = session.communicate(timeout=held + 30)
        assert session.returncode == 0, err
    finally:
        if session.poll() is None:
            session.kill()
            session.communicate(timeout=10)
    condition_is(kube, tenant, "reader", "True", "Idle", timeout=IDLE_TIMEOUT + 20)
    assert frozen(agent, cid)
    delete_sandbox(kube, tenant, "reader")


def test_a_claim_binding_an_idle_paused_pool_member_resumes_it(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str]
) -> None:
    _, tenant = places
    api = client.CustomObjectsApi(kube)
    cid = idle_sandbox(kube, agent, tenant, "spare")
    # As a pool's member carries its pool's label, and a claim's bind swaps it.
    api.patch_namespaced_custom_object(
        GROUP, VERSION, tenant, "sandboxes", "spare", {"metadata": {"labels": {POOL_LABEL: "p"}}}
    )
    condition_is(kube, tenant, "spare", "True", "Idle", timeout=IDLE_TIMEOUT + 20)
    assert frozen(agent, cid)
    hold_still(kube, tenant, "spare")
    bind = {"metadata": {"labels": {POOL_LABEL: None, CLAIM_LABEL: "someone"}}}
    api.patch_namespaced_custom_object(GROUP, VERSION, tenant, "sandboxes", "spare", bind)
    resumed = condition_is(kube, tenant, "spare", "False", "Resumed", timeout=15)
    c = paused_condition(resumed)
    assert c is not None and "claim" in c["message"]
    assert not frozen(agent, cid)
    delete_sandbox(kube, tenant, "spare")


def test_with_paused_streams_resume_an_exec_thaws_a_paused_sandbox_until_it_ends(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    _, tenant = places
    sandbox = running_sandbox(kube, agent, tenant, "napper", "sleep 100000")
    cid = sandbox["status"]["containerId"]
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        GROUP, VERSION, tenant, "sandboxes", "napper", {"spec": {"operatingMode": "Paused"}}
    )
    condition_is(kube, tenant, "napper", "True", "Paused", timeout=15)
    assert frozen(agent, cid)
    wait_for(
        lambda: paused_condition(agent.sandbox_watch.get(f"{tenant}/napper")) is not None,
        timeout=10,
        what="the agent's watch to see the pause",
    )
    done = sandlot(
        "exec",
        "napper",
        "-n",
        tenant,
        "--",
        "sh",
        "-c",
        "sleep 1; echo thawed",
        kubeconfig=users["operator-person"],
    )
    assert (done.returncode, done.stdout.strip()) == (0, "thawed"), done.stderr
    events = event_reasons(kube, tenant, "napper")
    wait_for(
        lambda: "ResumedOnUse" in event_reasons(kube, tenant, "napper"),
        timeout=10,
        what=f"a ResumedOnUse Event about the sandbox (seen: {events})",
    )
    # Its streams ended: the spec's pause holds again.
    again = condition_is(kube, tenant, "napper", "True", "Paused", timeout=15)
    assert again["spec"]["operatingMode"] == "Paused"
    assert frozen(agent, cid)
    delete_sandbox(kube, tenant, "napper")


def suspended_is(
    kube: client.ApiClient, namespace: str, name: str, status: str, reason: str, timeout: float
) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        sb = get_sandbox(kube, namespace, name)
        if sb is None:
            return None
        said = [
            c
            for c in (sb.get("status") or {}).get("conditions") or []
            if c["type"] == "Suspended" and (c["status"], c["reason"]) == (status, reason)
        ]
        return sb if said else None

    return wait_for(
        probe, timeout=timeout, what=f"sandbox {name}'s Suspended condition {status} ({reason})"
    )


def idle_suspending_sandbox(
    kube: client.ApiClient, agent: Agent, namespace: str, name: str
) -> dict[str, Any]:
    """A Running sandbox that wrote a file, then got an idle timeout with
    ``idleAction: Suspend``: its body."""
    sandbox = running_sandbox(
        kube, agent, namespace, name, "echo before > /kept; exec sleep 100000"
    )
    client.CustomObjectsApi(kube).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        "sandboxes",
        name,
        {"spec": {"idleTimeoutSeconds": IDLE_TIMEOUT, "idleAction": "Suspend"}},
    )
    return sandbox


def test_an_idle_sandbox_set_to_suspend_is_suspended_and_an_exec_starts_it_again(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str], users: dict[str, Path]
) -> None:
    """Quiet past its timeout, it is committed and its container removed with the
    spec still Running (the Suspended condition says Idle, an Event too); the sync
    leaves it so; an exec starts it again from its files and runs in it."""
    _, tenant = places
    first = idle_suspending_sandbox(kube, agent, tenant, "sleeper")
    cid = first["status"]["containerId"]
    suspended = suspended_is(kube, tenant, "sleeper", "True", "Idle", timeout=IDLE_TIMEOUT + 30)
    assert suspended["spec"]["operatingMode"] == "Running", "the spec was rewritten"
    assert suspended["status"]["phase"] == "Running"
    wait_for(
        lambda: cid not in {c.id for c in agent.parts.runtime.list_containers(timeout=5)},
        timeout=20,
        what="the idle sandbox's container removed",
    )
    wait_for(
        lambda: "IdleSuspended" in event_reasons(kube, tenant, "sleeper"),
        timeout=10,
        what="an IdleSuspended Event about the sandbox",
    )
    passes = agent.registry.get_sample_value("sandlot_agent_sync_passes_total") or 0
    hold_still(kube, tenant, "sleeper")  # a spec change: it wakes a sync pass
    wait_for(
        lambda: (
            (agent.sandbox_watch.get(f"{tenant}/sleeper") or {})
            .get("spec", {})
            .get("idleTimeoutSeconds")
            == 3600
        ),
        timeout=10,
        what="the agent's watch to see the longer timeout",
    )
    wait_for(  # the sync holds it suspended: no restore for a Running spec
        lambda: (
            (agent.registry.get_sample_value("sandlot_agent_sync_passes_total") or 0) >= passes + 1
        ),
        timeout=20,
        what="a sync pass after the spec change",
    )
    assert cid not in {c.id for c in agent.parts.runtime.list_containers(timeout=5)}
    containers = agent.parts.runtime.list_containers(timeout=5)
    mine = [c for c in containers if c.labels.get(SANDBOX_LABEL) == f"{tenant}/sleeper"]
    assert not mine, "started again without a use"

    done = sandlot(
        "exec", "sleeper", "-n", tenant, "--", "cat", "/kept", kubeconfig=users["operator-person"]
    )
    assert (done.returncode, done.stdout.strip()) == (0, "before"), done.stderr
    again = suspended_is(kube, tenant, "sleeper", "False", "Restored", timeout=10)
    assert again["status"]["pid"] != first["status"]["pid"], "the same process: never suspended"
    assert agent.registry.get_sample_value("sandlot_agent_idle_suspends_total") == 1
    delete_sandbox(kube, tenant, "sleeper")


def test_a_claim_binding_an_idle_suspended_pool_member_starts_it_again(
    kube: client.ApiClient, agent: Agent, places: tuple[str, str]
) -> None:
    _, tenant = places
    api = client.CustomObjectsApi(kube)
    idle_suspending_sandbox(kube, agent, tenant, "stored-spare")
    api.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        tenant,
        "sandboxes",
        "stored-spare",
        {"metadata": {"labels": {POOL_LABEL: "p"}}},
    )
    suspended_is(kube, tenant, "stored-spare", "True", "Idle", timeout=IDLE_TIMEOUT + 30)
    hold_still(kube, tenant, "stored-spare")
    bind = {"metadata": {"labels": {POOL_LABEL: None, CLAIM_LABEL: "someone"}}}
    api.patch_namespaced_custom_object(GROUP, VERSION, tenant, "sandboxes", "stored-spare", bind)
    again = suspended_is(kube, tenant, "stored-spare", "False", "Restored", timeout=30)
    pid = again["status"]["pid"]
    assert Path(f"/proc/{pid}/root/kept").read_text() == "before\n"
    delete_sandbox(kube, tenant, "stored-spare")
