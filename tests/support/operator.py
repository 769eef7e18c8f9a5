"""Running real ``sandlot operator`` processes against the test control plane, and
writing node Leases the way agents do."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.objects import Leases
from sandlot.api import GROUP, VERSION
from sandlot.api.keys import AGENT_LEASE_LABEL
from sandlot.devtools.controlplane import ControlPlane, free_port
from tests.support.wait import wait_for


class OperatorProcess:
    def __init__(
        self,
        plane: ControlPlane,
        workdir: Path,
        namespace: str,
        *flags: str,
        kubeconfig: Path | None = None,
        identity: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.identity = identity or f"op-{uuid.uuid4().hex[:6]}"
        self.log_path = workdir / f"{self.identity}.log"
        argv = [
            sys.executable,
            "-m",
            "sandlot.cli.main",
            "operator",
            "--kubeconfig",
            str(kubeconfig or plane.kubeconfig),
            "--namespace",
            namespace,
            "--metrics-port",
            str(self.port),
            "--identity",
            self.identity,
            *flags,
        ]
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env} if env is not None else None,
        )

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
            text: str = r.read().decode()
            return text

    def metric(self, name: str, **labels: str) -> float:
        total = 0.0
        for line in self.metrics().splitlines():
            if not line.startswith(name):
                continue
            m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)$", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
        return total

    def wait_metrics(self, timeout: float = 30) -> None:
        def up() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited {self.proc.returncode}:\n{self.log()}")
            try:
                self.metrics()
                return True
            except OSError:
                return False

        wait_for(up, timeout=timeout, what=f"operator {self.identity} to serve /metrics")

    def is_leader(self) -> bool:
        try:
            return self.metric("sandlot_operator_leader") == 1.0
        except OSError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()


class AgentLease:
    """Renews a node's Lease like an agent does, until paused or stopped.

    ``skew`` is how far the agent's clock is off: its renewTime stamps are that far
    from the real time, as a node with a drifting clock writes them.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        node: str,
        duration: int = 2,
        every: float = 0.5,
        skew: timedelta = timedelta(0),
    ) -> None:
        self.leases = Leases(api, namespace)
        self.node, self.duration, self.every, self.skew = node, duration, every, skew
        self._stop = threading.Event()
        self._running = threading.Event()
        self._lock = threading.Lock()  # held while a renewal is in flight
        self.renew()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.resume()

    def renew(self) -> datetime:
        now = datetime.now(UTC) + self.skew
        record = self.leases.get(self.node)
        if record is None:
            self.leases.create(
                self.node,
                holder=self.node,
                duration_seconds=self.duration,
                now=now,
                labels={AGENT_LEASE_LABEL: "true"},
            )
        else:
            self.leases.update(
                record,
                holder=self.node,
                duration_seconds=self.duration,
                renew_time=now,
                labels={AGENT_LEASE_LABEL: "true"},
            )
        self.last_renew = now
        return now

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            with self._lock:
                if not self._running.is_set():
                    continue
                try:
                    self.renew()
                except Exception:  # API server away: an agent keeps trying
                    continue

    def pause(self) -> datetime:
        """Stop renewing; returns the last renewTime written (after any renewal in flight)."""
        with self._lock:
            self._running.clear()
            return self.last_renew

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class Fleet:
    """Creates SandboxNodes and Sandboxes for one test and removes them after it."""

    def __init__(self, api: client.ApiClient, namespace: str, lease_namespace: str) -> None:
        self.api = api
        self.objs: Any = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.lease_namespace = lease_namespace
        self.nodes: list[str] = []
        self.leases: list[AgentLease] = []
        self.prefix = uuid.uuid4().hex[:5]

    def node(self, name: str, *, lease: bool = True, unschedulable: bool = False) -> str:
        full = f"{self.prefix}-{name}"
        self.objs.create_cluster_custom_object(
            GROUP,
            VERSION,
            "sandboxnodes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "SandboxNode",
                "metadata": {"name": full},
                "spec": {"unschedulable": unschedulable},
            },
        )
        self.nodes.append(full)
        return full

    def lease(self, node: str, duration: int = 2, skew: timedelta = timedelta(0)) -> AgentLease:
        al = AgentLease(self.api, self.lease_namespace, node, duration=duration, skew=skew)
        self.leases.append(al)
        return al

    def sandbox(self, name: str, node: str, phase: str | None = "Running", **spec: Any) -> str:
        self.objs.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxes",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "Sandbox",
                "metadata": {"name": name},
                "spec": {"image": "example.test/busybox:1", "nodeName": node, **spec},
            },
        )
        if phase:
            self.set_phase(name, phase)
        return name

    def set_phase(self, name: str, phase: str, **extra: Any) -> None:
        self.objs.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            self.namespace,
            "sandboxes",
            name,
            {"status": {"phase": phase, **extra}},
        )

    def get(self, name: str) -> dict[str, Any]:
        return dict(
            self.objs.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "sandboxes", name
            )
        )

    def phase(self, name: str) -> str | None:
        return (self.get(name).get("status") or {}).get("phase")

    def get_node(self, node: str) -> dict[str, Any]:
        return dict(self.objs.get_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node))

    def health(self, node: str) -> dict[str, Any]:
        return (self.get_node(node).get("status") or {}).get("health") or {}

    def cleanup(self) -> None:
        for al in self.leases:
            al.stop()
        for node in self.nodes:
            try:
                self.objs.patch_cluster_custom_object(
                    GROUP, VERSION, "sandboxnodes", node, {"metadata": {"finalizers": None}}
                )
                self.objs.delete_cluster_custom_object(GROUP, VERSION, "sandboxnodes", node)
            except ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture
def lease_namespace(kube: client.ApiClient) -> Iterator[str]:
    name = f"sl-{uuid.uuid4().hex[:8]}"
    core = client.CoreV1Api(kube)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def wipe_nodes(api: client.ApiClient) -> None:
    """Remove every SandboxNode, SandboxPool, Sandbox, SandboxSnapshot and CachePrune
    in this worker's control plane, their finalizers cleared. Operator tests judge the
    whole fleet (the mass-failure guard counts every node; pools and the scheduler act
    on every sandbox; the uninstall hooks' purge waits for every kind), and this
    control plane runs no namespace controller, so objects of earlier tests'
    namespaces linger."""
    objs: Any = client.CustomObjectsApi(api)
    for plural in ("sandboxpools", "sandboxsnapshots", "sandboxes", "sandboxnodes", "cacheprunes"):
        for item in objs.list_cluster_custom_object(GROUP, VERSION, plural)["items"]:
            meta = item["metadata"]
            try:
                if meta.get("finalizers"):
                    patch = {"metadata": {"finalizers": None}}
                    if "namespace" in meta:
                        objs.patch_namespaced_custom_object(
                            GROUP, VERSION, meta["namespace"], plural, meta["name"], patch
                        )
                    else:
                        objs.patch_cluster_custom_object(
                            GROUP, VERSION, plural, meta["name"], patch
                        )
                if "namespace" in meta:
                    objs.delete_namespaced_custom_object(
                        GROUP, VERSION, meta["namespace"], plural, meta["name"]
                    )
                else:
                    objs.delete_cluster_custom_object(GROUP, VERSION, plural, meta["name"])
            except ApiException as e:
                if e.status != 404:
                    raise


@pytest.fixture
def fleet(kube: client.ApiClient, namespace: str, lease_namespace: str) -> Iterator[Fleet]:
    wipe_nodes(kube)
    f = Fleet(kube, namespace, lease_namespace)
    yield f
    f.cleanup()


@pytest.fixture
def operators(
    control_plane: ControlPlane, tmp_path: Path, lease_namespace: str
) -> Iterator[Callable[..., OperatorProcess]]:
    started: list[OperatorProcess] = []

    def start(*flags: str) -> OperatorProcess:
        op = OperatorProcess(control_plane, tmp_path, lease_namespace, *flags)
        started.append(op)
        op.wait_metrics()
        return op

    yield start
    for op in started:
        op.stop()


__all__ = ["AgentLease", "Fleet", "OperatorProcess", "os"]
