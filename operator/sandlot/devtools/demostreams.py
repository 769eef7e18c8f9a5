"""The demo's claim, ``sandlot logs`` and ``sandlot exec``.

The local gateway and agents are plain processes, so the demo gives them what a
cluster gives their pods: an address the API server will reach (``streamnet``: an
interface of the demo's own with a private address), the stream certificates the
chart would make (``certs``), the gateway's APIService and endpoint
(``gatewayrig``) and a stand-in Pod per agent (``adapters.agentpods``). Then a
``SandboxClaim`` takes a Running member of the pool, and the CLI reads that
sandbox's output and runs a command in it, through the API server like any user.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from sandlot.adapters.agentpods import publish_agent_pod
from sandlot.adapters.kube import load_api_client
from sandlot.client import Client, Sandbox
from sandlot.devtools.certs import StreamCerts
from sandlot.devtools.controlplane import free_port
from sandlot.devtools.gatewayrig import STANDIN_SELECTOR, publish_gateway
from sandlot.devtools.streamnet import StreamAddress

AGENT_NAMESPACE = "sandlot-system"
CLI_TIMEOUT = 180  # seconds; a loaded machine takes long just to start the interpreter


class DemoStreams:
    """The stream address of the demo's gateway and agents, their certificates,
    ports and stand-in Pods."""

    def __init__(self, kubeconfig: Path, workdir: Path, nodes: tuple[str, ...]) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.address = StreamAddress()
        self.ports = {node: free_port() for node in nodes}
        self.gateway_port = free_port()
        self.certs: StreamCerts | None = None

    def create(self) -> None:
        self.address.create()
        self.certs = StreamCerts.create(
            self.workdir / "stream-certs", AGENT_NAMESPACE, (self.address.ip,)
        )

    def gateway_args(self) -> list[str]:
        """``sandlot gateway``'s arguments: on the stream address, finding the stand-ins."""
        assert self.certs is not None, "create() makes the certificates first"
        return [
            "gateway",
            *("--kubeconfig", str(self.kubeconfig), "--namespace", AGENT_NAMESPACE),
            *("--bind", self.address.ip, "--port", str(self.gateway_port)),
            *("--tls-cert", str(self.certs.gateway.cert), "--tls-key", str(self.certs.gateway.key)),
            *("--stream-ca", str(self.certs.agent_ca.cert), "--agent-selector", STANDIN_SELECTOR),
            *("--metrics-port", "0"),
        ]

    def publish_gateway(self) -> None:
        """The APIService and the gateway's endpoint; returns once the API server reaches it."""
        assert self.certs is not None, "create() makes the certificates first"
        api = load_api_client(str(self.kubeconfig))
        try:
            publish_gateway(
                api, AGENT_NAMESPACE, self.address.ip, self.gateway_port, self.certs.ca.cert
            )
        finally:
            api.close()

    def remove(self) -> None:
        self.address.remove()

    @staticmethod
    def pod(node: str) -> str:
        return f"sandlot-agent-{node}"

    def agent_flags(self, node: str) -> list[str]:
        """The agent's stream flags; its stand-in Pod is recorded first."""
        assert self.certs is not None, "create() makes the certificates first"
        api = load_api_client(str(self.kubeconfig))
        try:
            publish_agent_pod(
                api, AGENT_NAMESPACE, self.pod(node), self.address.ip, self.ports[node], node
            )
        finally:
            api.close()
        return [
            *("--stream-port", str(self.ports[node]), "--stream-bind", self.address.ip),
            *("--stream-tls-cert", str(self.certs.agent(node).cert)),
            *("--stream-tls-key", str(self.certs.agent(node).key)),
            *("--stream-client-ca", str(self.certs.ca.cert)),
        ]


def sandlot(kubeconfig: Path, *args: str) -> str:
    """Run the CLI as a user would, printing the command and what it printed."""
    proc = subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", *args],
        env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    print(f"$ sandlot {shlex.join(args)}", flush=True)
    print((proc.stdout + proc.stderr).rstrip() + f"\n(exit {proc.returncode})", flush=True)
    if proc.returncode not in (0, 3):
        raise RuntimeError(f"sandlot {' '.join(args)} exited {proc.returncode}")
    return proc.stdout


def claim_and_stream(kc: Callable[..., str], kubeconfig: Path) -> None:
    """Claim a member of the pool through the SDK, as a program would, then read its
    logs and run commands in it with the CLI; leaving the block releases it."""
    print(f"$ python: Client({str(kubeconfig)!r}, namespace='demo').claim('web', name='mine')")
    with (
        Client(kubeconfig, namespace="demo") as sdk,
        sdk.claim("web", name="mine", timeout=120) as sb,
    ):
        print(f"-> {sb!r}, claim {sb.claim}, address {sb.ip}", flush=True)
        print(kc("get", "sbclaim", "-n", "demo", "-o", "wide"), flush=True)
        sandlot(kubeconfig, "logs", sb.name, "-n", "demo", "--tail", "5")
        for command in ("hostname; cat /www/index.html", "echo exiting 3 >&2; exit 3"):
            sandlot(kubeconfig, "exec", sb.name, "-n", "demo", "--", "sh", "-c", command)
        print(f"$ python: {sb.name} -> run(['cat', '/www/index.html'])", flush=True)
        print(sb.run(["cat", "/www/index.html"], timeout=60).stdout.decode().rstrip(), flush=True)
        pause_and_resume(sb)


def pause_and_resume(sb: Sandbox) -> None:
    """Freeze the claimed sandbox in place and thaw it: the same process (its start
    time, from /proc), node and address after."""
    started = ["sh", "-c", "cut -d' ' -f22 /proc/1/stat"]  # the main process's start time
    before = sb.run(started, timeout=60).stdout.decode().strip()
    print(f"$ python: {sb.name} -> pause()", flush=True)
    paused = sb.pause()
    node = (paused.body.get("spec") or {}).get("nodeName")
    print(f"-> {paused!r}: frozen in place on {node}, address {paused.ip}", flush=True)
    print(f"$ python: {sb.name} -> resume()", flush=True)
    resumed = sb.resume()
    after = sb.run(started, timeout=60).stdout.decode().strip()
    same = "the same" if before == after else "a different"
    print(
        f"-> {resumed!r}, its main process started at tick {after} ({same} process as before)",
        flush=True,
    )


__all__ = ["DemoStreams", "claim_and_stream"]
