"""``sandlot demo``: the whole story on one machine, in about a minute.

It starts a local control plane (etcd + kube-apiserver), a private containerd,
the operator and two agents (nodes ``demo-1`` and ``demo-2``, each with its own
containerd namespace), creates a pool of four sandboxes behind a Service, and
then kills the agent of ``demo-1`` outright, leaving its containers running. It
prints ``kubectl get sandboxes`` whenever it changes: after the lease expires and
the (short) grace period ends, the lost node's sandboxes go Dead, leave the
EndpointSlice, and replacements run on ``demo-2``. The restarted agent tears the
dead sandboxes' containers down instead of re-adopting them. A ``SandboxClaim``
then takes one of the pool's sandboxes, and ``sandlot logs`` / ``sandlot exec``
read its output and run commands in it through the API server
(``demostreams``). Last, ``sandlot cache clear containerd --all`` prunes both
nodes.

Sandboxes get their own addresses through CNI, as on a cluster: the demo writes a
bridge + host-local network (bridge ``sldemo0``, 10.88.0.0/24) under its directory
and the agents run the OS's CNI plugins (``containernetworking-plugins``) with it,
so the EndpointSlice lists real sandbox addresses and their pages answer from this
host. Without the plugins the agents fall back to the node's address.

It ends by itself and leaves nothing running; ``--keep`` leaves it all up and
prints how to reach it (``sandlot dev down --dir DIR`` stops it). Running
containers needs root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandlot.api.node import NodePhase
from sandlot.api.sandbox import SandboxPhase
from sandlot.devtools.containerd import (
    PrivateContainerd,
    start_private_containerd,
    unavailable_reason,
)
from sandlot.devtools.controlplane import kubectl_path
from sandlot.devtools.demonet import DemoNetwork
from sandlot.devtools.demostreams import DemoStreams, claim_and_stream
from sandlot.devtools.dev import reset, start_local, stop_left_over, write_state
from sandlot.devtools.ociarchive import build_image_archive
from sandlot.devtools.registry import LOOPBACK_HOSTS, Registry, start_registry

IMAGE = "sandlot/demo-busybox:1"  # pushed to the demo's own registry, pulled by the agents
FILLER_BYTES = 24 * 1024 * 1024  # enough that the pull shows in the table
NODES = ("demo-1", "demo-2")
LEASE = "4s"
GRACE = "6s"
LOG_TAIL = 30  # lines of each program's log a failed demo prints
POOL = """\
apiVersion: sandlot.dev/v1alpha1
kind: SandboxPool
metadata:
  name: web
  namespace: demo
spec:
  replicas: 4
  serviceName: web
  template:
    metadata:
      labels: {app: web}
    spec:
      image: IMAGE_REF
      command: ["sh", "-c", "mkdir -p /www && echo hello from $(busybox hostname) > /www/index.html && echo web: serving /www on :8080 as $(busybox hostname) && exec busybox httpd -f -vv -p 8080 -h /www"]
      ports: [{name: http, containerPort: 8080}]
"""


class Demo:
    def __init__(self, workdir: Path, step_timeout: float) -> None:
        self.workdir = workdir
        self.step_timeout = step_timeout
        self.kubectl = str(kubectl_path())
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.containerd: PrivateContainerd | None = None
        self.registry: Registry | None = None
        self.network = DemoNetwork(workdir)
        self.kubeconfig = workdir / "kubeconfig"
        self.streams = DemoStreams(self.kubeconfig, self.workdir, NODES)
        self.started = time.monotonic()
        self._last_table = ""

    # -- output -------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"\n[{time.monotonic() - self.started:5.1f}s] {text}", flush=True)

    def web_endpoints(self, jsonpath: str) -> str:
        """The web pool's EndpointSlices, printed by kubectl with ``jsonpath``."""
        return self.kc(
            "get",
            "endpointslices",
            "-n",
            "demo",
            "-l",
            "kubernetes.io/service-name=web",
            "-o",
            f"jsonpath={jsonpath}",
        )

    def kc(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        proc = subprocess.run(
            [self.kubectl, *args],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def show_sandboxes(self, force: bool = False) -> None:
        """Print ``kubectl get sandboxes -o wide`` when anything but AGE changed."""
        key = self.kc(
            "get",
            "sandboxes",
            "-n",
            "demo",
            "--sort-by=.metadata.name",
            "-o",
            "custom-columns=N:.metadata.name,P:.status.phase,H:.spec.nodeName,I:.status.ip,R:.status.reason",
        )
        if force or key != self._last_table:
            self._last_table = key
            table = self.kc(
                "get", "sandboxes", "-n", "demo", "-o", "wide", "--sort-by=.metadata.name"
            )
            print(
                f"$ kubectl get sandboxes -n demo -o wide    (t={time.monotonic() - self.started:.1f}s)"
            )
            print(table.rstrip(), flush=True)

    def wait(self, what: str, probe: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.step_timeout
        while not probe():
            self.show_sandboxes()
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {self.step_timeout:.0f}s waiting for {what}")
            for name, proc in self.procs.items():
                if proc.poll() is not None and name != "agent-demo-1":
                    raise RuntimeError(
                        f"{name} exited ({proc.returncode}); see {self.workdir / name}.log"
                    )
            time.sleep(0.5)
        self.show_sandboxes()

    def fetch_pages(self) -> None:
        """GET each sandbox's page through its address in the EndpointSlice."""
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        addresses = self.web_endpoints("{.items[*].endpoints[*].addresses[0]}").split()
        for address in addresses:
            page = "(no answer)"
            for _ in range(20):
                try:
                    with opener.open(f"http://{address}:8080/", timeout=2) as r:
                        page = r.read().decode().strip()
                    break
                except OSError as exc:
                    page = f"(no answer: {exc})"
                    time.sleep(0.25)
            print(f"$ curl http://{address}:8080/   ->  {page}", flush=True)

    def sandboxes(self) -> list[dict[str, Any]]:
        return list(json.loads(self.kc("get", "sandboxes", "-n", "demo", "-o", "json"))["items"])

    # -- processes -------------------------------------------------------------------

    def show_logs(self, lines: int = LOG_TAIL) -> None:
        """The last ``lines`` of each program's log: what a failed step looked like
        from the operator's, the gateway's and the agents' side."""
        for name in sorted(self.procs):
            path = self.workdir / f"{name}.log"
            try:
                tail = path.read_bytes()[-64 * 1024 :].decode(errors="replace").splitlines()
            except OSError:
                continue
            print(f"--- the last {lines} lines of {path}", flush=True)
            print("\n".join(tail[-lines:]), flush=True)

    def spawn(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "sandlot.cli.main", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.record()  # so that `sandlot dev down` finds it, even if this run dies

    def start_agent(self, node: str) -> None:
        assert self.containerd is not None
        self.spawn(
            f"agent-{node}",
            *("agent", "--node-name", node, "--kubeconfig", str(self.kubeconfig)),
            *("--containerd-address", self.containerd.address),
            *("--containerd-namespace", f"sandlot-{node}"),
            *("--containerd-root", str(self.containerd.root)),
            *("--lease-duration", LEASE, "--renew-interval", "1s", "--reap-interval", "2s"),
            *("--stop-grace", "2s", "--kill-wait", "3s", "--metrics-port", "0"),
            *("--log-dir", str(self.workdir / "logs" / node), "--gc-min-age", "0s"),
            *(arg for host in LOOPBACK_HOSTS for arg in ("--registry-private-hosts", host)),
            *self.network.agent_flags(),
            *self.streams.agent_flags(node),
        )

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.containerd is not None:
            self.network.release(self.containerd.address, NODES)
            self.network.remove_bridge()
        self.streams.remove()
        if self.containerd is not None:
            self.containerd.stop()
            self.containerd.remove()
        if self.registry is not None:
            self.registry.stop()

    def state(self) -> dict[str, Any]:
        state_file = self.workdir / "state.json"
        state = json.loads(state_file.read_text()) if state_file.exists() else {}
        state.setdefault("pids", {}).update({n: p.pid for n, p in self.procs.items()})
        state["streamLink"] = self.streams.address.link
        state["nodes"] = list(NODES)
        if self.registry is not None and self.registry.process is not None:
            state["pids"]["registry"] = self.registry.process.pid
        if self.containerd is not None:
            state["pids"]["containerd"] = self.containerd.process.pid  # type: ignore[union-attr]
            state["containerd"] = {
                "address": self.containerd.address,
                "root": str(self.containerd.root_dir),
            }
        return state

    def record(self) -> None:
        write_state(self.workdir, self.state())

    # -- the story -------------------------------------------------------------------

    def run(self) -> None:
        self.start_cluster()
        self.start_programs()
        self.create_pool()
        self.kill_agent_of_demo_1()
        self.restart_agent_of_demo_1()
        self.say("claiming a sandbox of the pool, then its logs and a command in it")
        claim_and_stream(self.kc, self.kubeconfig)
        self.clear_caches()

    def running_count(self) -> int:
        return sum(
            1
            for s in self.sandboxes()
            if (s.get("status") or {}).get("phase") == SandboxPhase.RUNNING
        )

    def start_cluster(self) -> None:
        """The control plane, the demo's namespaces, containerd and the image."""
        self.say("starting a local control plane (etcd + kube-apiserver) with sandlot's CRDs")
        start_local(self.workdir)
        self.kc("create", "namespace", "sandlot-system")
        self.kc("create", "namespace", "demo")
        self.streams.create()  # the address the API server proxies logs and exec to

        self.say("starting a private containerd, and a registry on loopback with a busybox image")
        self.containerd = start_private_containerd()
        self.registry = start_registry(self.workdir / "registry")
        archive = self.workdir / "busybox.tar"
        image = self.registry.ref(IMAGE)
        filler = {"/filler": os.urandom(FILLER_BYTES)}
        build_image_archive(archive, image, extra_files=filler, compress=True)
        self.registry.push(archive, IMAGE)

    def start_programs(self) -> None:
        """The operator and both agents, until both nodes are Ready."""
        self.say(f"starting the operator (grace period {GRACE}) and two agents (lease {LEASE})")
        self.spawn(
            "operator",
            "operator",
            "--kubeconfig",
            str(self.kubeconfig),
            "--grace-period",
            GRACE,
            "--resync-interval",
            "2s",
            "--metrics-port",
            "0",
        )
        self.spawn("gateway", *self.streams.gateway_args())
        self.streams.publish_gateway()  # logs and exec: through the API server to it
        for node in NODES:
            self.start_agent(node)
        self.wait(
            "both nodes Ready",
            lambda: (
                self.kc(
                    "get", "snode", "-o", "jsonpath={range .items[*]}{.status.phase}{' '}{end}"
                ).split()
                == [NodePhase.READY, NodePhase.READY]
            ),
        )
        print(self.kc("get", "snode"))

    def create_pool(self) -> None:
        assert self.registry is not None, "start_cluster starts the registry first"
        self.say("creating a pool of 4 sandboxes behind the Service 'web'; each node pulls once")
        pool = POOL.replace("IMAGE_REF", self.registry.ref(IMAGE))
        print(pool)
        self.kc("apply", "-f", "-", stdin=pool)
        self.wait("4 sandboxes Running", lambda: self.running_count() == 4)
        print(
            self.kc("get", "endpointslices", "-n", "demo", "-l", "kubernetes.io/service-name=web")
        )
        self.fetch_pages()

    def kill_agent_of_demo_1(self) -> None:
        """SIGKILL demo-1's agent; its sandboxes go Dead and are replaced on demo-2."""
        lost = [
            s["metadata"]["name"] for s in self.sandboxes() if s["spec"].get("nodeName") == "demo-1"
        ]
        self.say(
            f"killing demo-1's agent (SIGKILL); its containers keep running: {', '.join(lost)}"
        )
        killed = self.procs["agent-demo-1"]
        killed.send_signal(signal.SIGKILL)
        killed.wait(10)
        t0 = time.monotonic()
        self.wait(
            "the lost node's sandboxes Dead",
            lambda: all(
                (s.get("status") or {}).get("phase") == SandboxPhase.DEAD
                for s in self.sandboxes()
                if s["metadata"]["name"] in lost
            ),
        )
        self.say(
            f"{len(lost)} sandboxes Dead {time.monotonic() - t0:.1f}s after the kill "
            f"(lease {LEASE} + grace {GRACE}); replacements are being scheduled on demo-2"
        )
        self.wait("4 live sandboxes again", lambda: self.running_count() == 4)
        print(
            self.web_endpoints(
                "{range .items[*].endpoints[*]}{.addresses[0]} {.targetRef.name}{'\\n'}{end}"
            )
        )
        self.fetch_pages()
        print(self.kc("get", "snode"))

    def restart_agent_of_demo_1(self) -> None:
        """The restarted agent finds its sandboxes Dead and tears their containers down."""
        assert self.containerd is not None
        self.say(
            "restarting demo-1's agent: it finds its sandboxes Dead and tears their containers down"
        )
        self.start_agent("demo-1")
        self.wait(
            "demo-1 Ready again",
            lambda: (
                self.kc("get", "snode", "demo-1", "-o", "jsonpath={.status.phase}")
                == NodePhase.READY
            ),
        )
        time.sleep(2)
        tasks = subprocess.run(
            ["ctr", "-a", self.containerd.address, "-n", "sandlot-demo-1", "tasks", "ls"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        print(f"$ ctr -n sandlot-demo-1 tasks ls\n{tasks.rstrip() or '(no tasks)'}")

    def clear_caches(self) -> None:
        self.say("sandlot cache clear containerd --all")
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "sandlot.cli.main",
                "cache",
                "clear",
                "containerd",
                "--all",
                "--timeout",
                "60s",
            ],
            env=env,
            timeout=120,
            check=False,
        )


def run_demo(directory: str, step_timeout: float, keep: bool) -> int:
    """Run the demo under ``directory``; with ``keep``, leave it running at the end."""
    reason = unavailable_reason()
    if reason:
        print(f"sandlot demo: {reason}", file=sys.stderr)
        return 2
    workdir = Path(directory).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    reset(workdir)  # the story starts from an empty cluster, whatever an earlier run left
    demo = Demo(workdir, step_timeout)
    ok = False
    try:
        demo.run()
        ok = True
    finally:
        if keep and ok:
            demo.record()
            demo.say("left running. Try:")
            print(f"  export KUBECONFIG={demo.kubeconfig}")
            print(f"  {demo.kubectl} get sandboxes -n demo -o wide")
            print(f"  {demo.kubectl} get snode -o wide")
            print(f"  sandlot dev down --dir {directory}      # stops everything")
        else:
            if not ok:
                demo.show_logs()
            demo.stop_all()
            stop_left_over(workdir)  # the control plane, and whatever stop_all could not
            demo.say("stopped everything" + ("" if ok else " (the demo failed)"))
    return 0
