"""Runtime handlers, claimed against a real agent, kube-apiserver and containerd
(both release lines): the agent publishes the handlers its containerd's CRI
configuration declares (runc, and crun through the runc shim's ``BinaryName``), a
sandbox whose RuntimeClass names crun is run by crun (``crun list`` over the shim's
state shows it, ``runc list`` does not), and the sandbox's isolation is the same
under both: capabilities, no new privileges, seccomp, masked and read-only paths.
On containerd 2.x a sandbox whose class names gvisor runs on gVisor's kernel: its
``uname`` and ``dmesg`` are gVisor's (in its log, and through an exec), and runsc
lists its container.
"""

from __future__ import annotations

import ipaddress
import json
import os
import queue
import re
import ssl
import subprocess
import threading
import urllib.request
import uuid
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from sandlot.adapters.containerd.execs import open_execs
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.streams import StreamServer
from sandlot.api.common import GROUP, VERSION
from sandlot.devtools.containerd import PrivateContainerd, gvisor_bin_dir
from sandlot.policy.ocispec import DEFAULT_CAPABILITIES, capability_mask
from sandlot.policy.streams import (
    FILES,
    LIST,
    PORTFORWARD,
    READ,
    STATUS,
    STDIN,
    STDOUT,
    WRITE,
    StreamRequest,
    close_stdin_frame,
    decode_frame,
    encode_frame,
)
from tests.support import agents
from tests.support.containerd_fixtures import EVERY_CONTAINERD, LINE_2, LINE_OS
from tests.support.runtimeclasses import (
    HandlerRig,
    oci_runtime_list,
    runsc_list,
    runtime_class,
)
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.containerd, EVERY_CONTAINERD]

DONE = "__done__"
SLEEP = "sleep 1000"
# What SPEC section 7 fixes, read from inside: the status lines, the masked files'
# sizes, a write to a read-only /proc path, and the masked /sys/firmware.
# Its shell's own complaints (a masked or absent /proc file, a read-only sysctl) go
# nowhere: the runtime copies stdout and stderr into the log separately, and a
# complaint landing inside a line of the report would hide that line.
PROBE = (
    "exec 2>/dev/null; "
    "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; "
    "for p in /proc/keys /proc/timer_list /proc/kcore; do "
    'echo "size $p $(busybox wc -c < $p 2>/dev/null)"; done; '
    "echo 0 > /proc/sys/kernel/panic 2>/dev/null && echo sysctl written || echo sysctl refused; "
    'echo "firmware $(ls /sys/firmware | busybox wc -l)"; '
    f"echo {DONE}; {SLEEP}"
)


def test_the_agent_publishes_the_handlers_its_containerd_offers(
    handler_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    # gVisor's shim speaks containerd 2's shim protocol: the 2.x rig declares it.
    expected = ["crun", "gvisor", "runc"] if containerd.line == LINE_2 else ["crun", "runc"]
    if containerd.line == LINE_2:
        assert gvisor_bin_dir() is not None, "gVisor is not built (make setup builds it)"
    node = handler_rig.sandbox_node()
    handlers = [h["name"] for h in node["status"]["runtimeHandlers"]]
    assert sorted(handlers) == expected, node["status"]


def test_a_crun_class_runs_under_crun_and_no_class_under_runc(handler_rig: HandlerRig) -> None:
    with runtime_class(handler_rig.kube, "crun") as crun_class:
        by_crun = handler_rig.run(SLEEP, runtimeClassName=crun_class)
        by_default = handler_rig.run(SLEEP)
        ids = {
            name: container_id_for(handler_rig.wait(name, "Running")["metadata"]["uid"])
            for name in (by_crun, by_default)
        }
    crun_listed = oci_runtime_list("crun", handler_rig.ctr_ns)
    runc_listed = oci_runtime_list("runc", handler_rig.ctr_ns)
    assert ids[by_crun] in crun_listed and ids[by_crun] not in runc_listed, crun_listed
    assert ids[by_default] in runc_listed and ids[by_default] not in crun_listed, runc_listed


def _isolation(rig: HandlerRig, handler: str, runtime_class_name: str) -> dict[str, str]:
    """What the probe saw in a sandbox of the class, once that handler's OCI runtime
    is shown to be the one that created it."""
    name = rig.run(PROBE, runtimeClassName=runtime_class_name)
    uid = rig.wait(name, "Running")["metadata"]["uid"]
    assert container_id_for(uid) in oci_runtime_list(handler, rig.ctr_ns)
    out = rig.output(name, DONE)
    seen = dict(re.findall(r"^(\w+):\s*(\S+)$", out, re.MULTILINE))
    seen.update(re.findall(r"^(size \S+) (\d*)$", out, re.MULTILINE))
    seen["sysctl"] = "written" if "sysctl written" in out else "refused"
    firmware = re.search(r"^firmware (\d+)$", out, re.MULTILINE)
    assert firmware is not None, out
    seen["firmware"] = firmware.group(1)
    return seen


def test_isolation_is_the_same_under_runc_and_crun(handler_rig: HandlerRig) -> None:
    with (
        runtime_class(handler_rig.kube, "runc") as runc_class,
        runtime_class(handler_rig.kube, "crun") as crun_class,
    ):
        under_runc = _isolation(handler_rig, "runc", runc_class)
        under_crun = _isolation(handler_rig, "crun", crun_class)
    assert under_crun == under_runc
    baseline = capability_mask(DEFAULT_CAPABILITIES)
    for field in ("CapPrm", "CapEff", "CapBnd"):
        assert int(under_crun[field], 16) == baseline, under_crun
    assert int(under_crun["CapInh"], 16) == 0
    assert under_crun["NoNewPrivs"] == "1" and under_crun["Seccomp"] == "2", under_crun
    masked = {k: v for k, v in under_crun.items() if k.startswith("size ")}
    assert masked and set(masked.values()) <= {"0", ""}, under_crun
    assert under_crun["sysctl"] == "refused" and under_crun["firmware"] == "0", under_crun


def _exec_output(containerd: PrivateContainerd, rig: HandlerRig, container: str, *argv: str) -> str:
    execs = open_execs(containerd.address, rig.ctr_ns, str(rig.log_dir.parent / "fifos"))
    try:
        process = execs.start(container, "probe", list(argv), tty=False, stdin=False, timeout=30)
        try:
            chunks = []
            while chunk := os.read(process.stdout, 65536):
                chunks.append(chunk)
            assert execs.wait(process, timeout=30) == 0, chunks
        finally:
            process.release()
        return b"".join(chunks).decode()
    finally:
        execs.close()


@pytest.mark.containerd_lines(LINE_2)
def test_a_gvisor_class_runs_on_gvisor_s_kernel(
    handler_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    with runtime_class(handler_rig.kube, "gvisor") as gvisor_class:
        name = handler_rig.run(
            f"uname -r; dmesg | head -3; echo {DONE}; {SLEEP}", runtimeClassName=gvisor_class
        )
        uid = handler_rig.wait(name, "Running")["metadata"]["uid"]
        out = handler_rig.output(name, DONE)
    kernel = out.splitlines()[0]
    assert kernel.endswith("gvisor"), out  # 4.19.0-gvisor: not the node's
    assert "Starting gVisor..." in out, out
    assert container_id_for(uid) in runsc_list(handler_rig.ctr_ns)
    # An exec (containerd's Tasks.Exec, as `sandlot exec` uses) lands inside it too.
    exec_kernel = _exec_output(
        containerd, handler_rig, container_id_for(uid), "sh", "-c", "uname -r"
    )
    assert exec_kernel.strip() == kernel, exec_kernel


class _Gateway:
    """The gateway's end of one agent session: the frames it sends, then silence."""

    def __init__(self, *frames: bytes) -> None:
        self.incoming: queue.Queue[bytes] = queue.Queue()
        for frame in frames:
            self.incoming.put(frame)
        self.sent: list[bytes] = []

    def send(self, message: bytes) -> None:
        self.sent.append(message)

    def recv(self, timeout: float | None = None) -> bytes:
        try:
            return self.incoming.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None

    def close(self) -> None:
        pass

    def channel(self, wanted: int) -> bytes:
        frames = [decode_frame(m) for m in self.sent]
        return b"".join(data for channel, data in frames if channel == wanted)

    def status(self) -> dict[str, Any]:
        return dict(json.loads(self.channel(STATUS) or b"{}"))


def _agent_session(
    containerd: PrivateContainerd, rig: HandlerRig, name: str, asked: StreamRequest, *frames: bytes
) -> _Gateway:
    """One files (or port-forward) session served by the agent's stream server code
    (its per-handler choice included) over real containerd execs; at most 60s."""
    sandbox = rig.get(name)
    uid = sandbox["metadata"]["uid"]
    execs = open_execs(containerd.address, rig.ctr_ns, str(rig.log_dir.parent / "fifos"))
    server = StreamServer(
        rig.node,
        bind="127.0.0.1",
        port=0,
        tls=ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER),
        client_names=("gateway",),
        sandbox=lambda _key: rig.get(name),
        log_dir=str(rig.log_dir),
        execs=execs,
        call_timeout=20,
        stop=threading.Event(),
        idle=20,
    )
    gateway = _Gateway(*frames)
    session = threading.Thread(
        target=server._reach_in,
        args=(gateway, asked, container_id_for(uid), f"{rig.namespace}/{name}", uid),
        daemon=True,
    )
    try:
        session.start()
        session.join(60)
        assert not session.is_alive(), f"the {asked.kind} session did not end within 60s"
    finally:
        execs.close()
    return gateway


def _files(
    containerd: PrivateContainerd, rig: HandlerRig, name: str, op: str, path: str, *frames: bytes
) -> _Gateway:
    asked = StreamRequest(FILES, rig.namespace, name, op=op, path=path)
    return _agent_session(containerd, rig, name, asked, *frames)


@pytest.mark.containerd_lines(LINE_2)
def test_files_are_written_read_and_listed_inside_a_gvisor_sandbox(
    handler_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    with runtime_class(handler_rig.kube, "gvisor") as gvisor_class:
        name = handler_rig.run(f"echo {DONE}; {SLEEP}", runtimeClassName=gvisor_class)
        uid = handler_rig.wait(name, "Running")["metadata"]["uid"]
        handler_rig.output(name, DONE)
    body = b"written through the agent\n" * 1000
    wrote = _files(
        containerd,
        handler_rig,
        name,
        WRITE,
        "/tmp/note.txt",
        encode_frame(STDIN, body[:10000]),
        encode_frame(STDIN, body[10000:]),
        close_stdin_frame(),
    )
    assert wrote.status()["status"] == "Success", wrote.status()
    read = _files(containerd, handler_rig, name, READ, "/tmp/note.txt")
    assert read.status()["status"] == "Success", read.status()
    assert read.channel(STDOUT) == body
    listed = _files(containerd, handler_rig, name, LIST, "/tmp")
    entries = {e["name"]: e for e in json.loads(listed.channel(STDOUT))}
    assert entries["note.txt"]["type"] == "file", entries
    assert entries["note.txt"]["size"] == len(body), entries
    # The sandbox's own processes (on gVisor's kernel) see the same file.
    seen = _exec_output(
        containerd, handler_rig, container_id_for(uid), "sh", "-c", "busybox wc -c < /tmp/note.txt"
    )
    assert seen.strip() == str(len(body)), seen
    missing = _files(containerd, handler_rig, name, READ, "/tmp/absent")
    assert missing.status().get("code") == 404, missing.status()


# A server on the sandbox's loopback, and its own client of it: gVisor's netstack has
# a loopback only when the namespace it is given has one up.
LOOPBACK_SERVER = (
    "mkdir -p /tmp/www && echo hello-from-gvisor > /tmp/www/index.html && "
    "busybox httpd -p 127.0.0.1:8080 -h /tmp/www && "
    "busybox wget -q -O- http://127.0.0.1:8080/index.html; "
    f"echo {DONE}; {SLEEP}"
)


@pytest.mark.containerd_lines(LINE_2)
def test_a_gvisor_sandbox_has_a_loopback_and_its_port_is_forwarded(
    handler_rig: HandlerRig, containerd: PrivateContainerd
) -> None:
    with runtime_class(handler_rig.kube, "gvisor") as gvisor_class:
        name = handler_rig.run(LOOPBACK_SERVER, runtimeClassName=gvisor_class)
        uid = handler_rig.wait(name, "Running")["metadata"]["uid"]
        out = handler_rig.output(name, DONE)
    # Its own processes reach its loopback (before: "Cannot assign requested address").
    assert "hello-from-gvisor" in out, out
    asked = StreamRequest(PORTFORWARD, handler_rig.namespace, name, port=8080)
    forwarded = _agent_session(
        containerd,
        handler_rig,
        name,
        asked,
        encode_frame(STDIN, b"GET /index.html HTTP/1.0\r\n\r\n"),
        close_stdin_frame(),
    )
    answer = forwarded.channel(STDOUT)
    assert answer.startswith(b"HTTP/1."), (answer, forwarded.status())
    assert b"hello-from-gvisor" in answer, answer
    # The namespace is the agent's: made with the sandbox, gone with it.
    netns = Path("/run/netns") / f"sandlot-{container_id_for(uid)}"
    assert netns.exists(), netns
    client.CustomObjectsApi(handler_rig.kube).delete_namespaced_custom_object(
        GROUP, VERSION, handler_rig.namespace, "sandboxes", name
    )
    wait_for(lambda: not netns.exists(), timeout=60, what=f"{netns} removed with its sandbox")


def _ready(rig: HandlerRig, name: str) -> dict[str, Any] | None:
    for c in (rig.get(name).get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return dict(c)
    return None


@pytest.mark.containerd_lines(LINE_2)
def test_tcp_and_http_probes_of_a_gvisor_sandbox_are_made_inside_it(
    handler_rig: HandlerRig,
) -> None:
    every_second = {"periodSeconds": 1, "timeoutSeconds": 2}
    probes = {
        "tcp": {"tcpSocket": {"port": 8080}, **every_second},
        "http": {"httpGet": {"path": "/index.html", "port": 8080}, **every_second},
        "http-missing": {"httpGet": {"path": "/absent.html", "port": 8080}, **every_second},
        "tcp-closed": {"tcpSocket": {"port": 8081}, **every_second},
    }
    with runtime_class(handler_rig.kube, "gvisor") as gvisor_class:
        names = {
            kind: handler_rig.run(
                LOOPBACK_SERVER, runtimeClassName=gvisor_class, readinessProbe=probe
            )
            for kind, probe in probes.items()
        }
        for kind in ("tcp", "http"):
            wait_for(
                partial(
                    lambda n: (c := _ready(handler_rig, n)) and c["status"] == "True", names[kind]
                ),
                timeout=60,
                what=f"the {kind} probe's sandbox Ready",
            )
        for kind in ("http-missing", "tcp-closed"):
            # Probed and failing: the condition says False with the probe's own words.
            seen = wait_for(
                partial(
                    lambda n: (c := _ready(handler_rig, n)) and c.get("message") and c, names[kind]
                ),
                timeout=60,
                what=f"the {kind} probe's sandbox probed",
            )
            assert seen["status"] == "False", seen
            assert "exited 1" in seen["message"], seen


def gvisor_fragment(gvisor: Path, handler: str, options: Path | None, version: int = 3) -> str:
    """A containerd configuration fragment declaring ``handler`` as gVisor's shim by
    its path, with its options file when given (as the chart's installer writes it;
    ``version`` 2 is containerd 1.x's CRI plugin table)."""
    plugin = "io.containerd.cri.v1.runtime" if version == 3 else "io.containerd.grpc.v1.cri"
    table = f'plugins."{plugin}".containerd.runtimes.{handler}'
    text = (
        f'version = {version}\n[{table}]\n  runtime_type = "io.containerd.runsc.v1"\n'
        f'  runtime_path = "{gvisor / "containerd-shim-runsc-v1"}"\n'
    )
    if options is not None:
        text += (
            f'[{table}.options]\n  TypeUrl = "io.containerd.runsc.v1.options"\n'
            f'  ConfigPath = "{options}"\n'
        )
    return text


@pytest.mark.containerd_lines(LINE_2)
def test_a_runtime_installed_while_the_agent_runs_is_offered_then_withdrawn(
    kube: Any,
    namespace: str,
    containerd: PrivateContainerd,
    handler_rig_archive: Path,
    tmp_path: Path,
) -> None:
    """As the chart's installer does it: a containerd fragment put in the agent's
    runtimes_dir while it runs (gVisor's shim by its path, runsc through the options
    file) is published and runs a sandbox on gVisor's kernel, with no restart of
    containerd or the agent; removed, it is withdrawn."""
    gvisor = gvisor_bin_dir()
    assert gvisor is not None, "gVisor is not built (make setup builds it)"
    fragments, handler = tmp_path / "conf.d", "gvisor-late"
    fragments.mkdir()
    options = tmp_path / "runsc.toml"
    options.write_text(f'binary_name = "{gvisor / "runsc"}"\n')
    fragment = fragments / f"{handler}.toml"
    node, log_dir = f"node-{uuid.uuid4().hex[:8]}", tmp_path / "logs"
    with (
        agents.containerd_namespace(containerd, "late", handler_rig_archive) as ctr_ns,
        agents.agent_fleet(containerd, ctr_ns, log_dir) as fleet,
    ):
        fleet.start(
            kube, namespace, node, capacity_memory="1Gi", runtimes_dir=str(fragments),
            resync_interval=timedelta(seconds=1),
        )  # fmt: skip
        rig = HandlerRig(kube, namespace, node, ctr_ns, log_dir)
        try:

            def offered() -> list[str]:
                return [h["name"] for h in rig.sandbox_node()["status"]["runtimeHandlers"]]

            assert handler not in offered()
            fragment.write_text(gvisor_fragment(gvisor, handler, options))
            wait_for(lambda: handler in offered(), timeout=30, what=f"{handler} published")
            with runtime_class(kube, handler) as late_class:
                name = rig.run(f"uname -r; echo {DONE}; {SLEEP}", runtimeClassName=late_class)
                rig.wait(name, "Running")
                assert rig.output(name, DONE).splitlines()[0].endswith("gvisor")
            fragment.unlink()
            wait_for(lambda: handler not in offered(), timeout=30, what=f"{handler} withdrawn")
        finally:
            agents.delete_node(kube, node)


@pytest.mark.containerd_lines(LINE_OS)
def test_gvisor_is_not_offered_by_a_containerd_1_node(
    kube: Any,
    namespace: str,
    containerd: PrivateContainerd,
    handler_rig_archive: Path,
    tmp_path: Path,
) -> None:
    """gVisor's shim speaks containerd 2's bootstrap: on a 1.x node the agent leaves
    a gVisor handler out (every start would fail) while the node offers the rest."""
    gvisor = gvisor_bin_dir()
    assert gvisor is not None, "gVisor is not built (make setup builds it)"
    fragments, handler = tmp_path / "conf.d", "gvisor-on-1x"
    fragments.mkdir()
    (fragments / f"{handler}.toml").write_text(gvisor_fragment(gvisor, handler, None, 2))
    node, log_dir = f"node-{uuid.uuid4().hex[:8]}", tmp_path / "logs"
    with (
        agents.containerd_namespace(containerd, "old", handler_rig_archive) as ctr_ns,
        agents.agent_fleet(containerd, ctr_ns, log_dir) as fleet,
    ):
        fleet.start(kube, namespace, node, runtimes_dir=str(fragments))
        rig = HandlerRig(kube, namespace, node, ctr_ns, log_dir)
        try:
            published = wait_for(
                lambda: rig.sandbox_node().get("status", {}).get("runtimeHandlers"),
                timeout=30,
                what="the node's runtime handlers published",
            )
            names = sorted(h["name"] for h in published)
            assert "runc" in names and handler not in names, names
        finally:
            agents.delete_node(kube, node)


@pytest.mark.containerd_lines(LINE_2)
def test_a_gvisor_sandbox_has_a_loopback_where_the_agent_makes_no_namespaces(
    kube: Any,
    namespace: str,
    containerd: PrivateContainerd,
    handler_rig_archive: Path,
    tmp_path: Path,
) -> None:
    """The chart's agent without CNI cannot make network namespaces (its /run is
    read-only): a gVisor sandbox keeps the runtime's namespace, where no interface is
    up. With the runsc.toml the chart's installer writes then (network = "none"),
    gVisor gives it a loopback of its own: its httpd binds 127.0.0.1 and its wget
    reaches it (without it: "Cannot assign requested address")."""
    gvisor = gvisor_bin_dir()
    assert gvisor is not None, "gVisor is not built (make setup builds it)"
    fragments, handler = tmp_path / "conf.d", "gvisor-none"
    fragments.mkdir()
    options = tmp_path / "runsc.toml"
    options.write_text(f'binary_name = "{gvisor / "runsc"}"\n[runsc_config]\n  network = "none"\n')
    (fragments / f"{handler}.toml").write_text(gvisor_fragment(gvisor, handler, options))
    node, log_dir = f"node-{uuid.uuid4().hex[:8]}", tmp_path / "logs"
    with (
        agents.containerd_namespace(containerd, "nonet", handler_rig_archive) as ctr_ns,
        agents.agent_fleet(containerd, ctr_ns, log_dir) as fleet,
    ):
        agent = fleet.start(
            kube, namespace, node, capacity_memory="1Gi", runtimes_dir=str(fragments)
        )
        agent.parts.networking.own_namespaces = False  # as the chart's agent without CNI
        rig = HandlerRig(kube, namespace, node, ctr_ns, log_dir)
        try:
            with runtime_class(kube, handler) as none_class:
                name = rig.run(LOOPBACK_SERVER, runtimeClassName=none_class)
                uid = rig.wait(name, "Running")["metadata"]["uid"]
                out = rig.output(name, DONE)
            assert "hello-from-gvisor" in out, out
            netns = Path("/run/netns") / f"sandlot-{container_id_for(uid)}"
            assert not netns.exists(), "the agent made a namespace: not the case under test"
        finally:
            agents.delete_node(kube, node)


# Its loopback server, and a second server on every address (the veth's too).
CNI_SERVER = (
    "mkdir -p /tmp/www && echo hello-from-gvisor > /tmp/www/index.html && "
    "busybox httpd -p 8081 -h /tmp/www && busybox ip -4 addr && busybox ip route; "
    f"{LOOPBACK_SERVER}"
)


@pytest.mark.containerd_lines(LINE_2)
def test_a_gvisor_sandbox_with_cni_has_its_veth_address_and_a_loopback(
    kube: Any,
    namespace: str,
    containerd: PrivateContainerd,
    handler_rig_archive: Path,
    tmp_path: Path,
) -> None:
    """With CNI gVisor copies the agent's namespace: its loopback (the sandbox's own
    wget reaches its httpd on 127.0.0.1) and the veth the bridge plugin made (this
    host reaches it at its CNI address)."""
    bin_dirs = [d for d in ("/opt/cni/bin", "/usr/lib/cni") if Path(d, "bridge").exists()]
    assert bin_dirs, "the CNI plugins are not installed (scripts/bootstrap.sh installs them)"
    n = os.getpid() % 250
    bridge, subnet = f"slgv{n}", ipaddress.IPv4Network(f"10.78.{n}.0/24")
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-gvisor-test.conflist").write_text(
        json.dumps(
            {
                "cniVersion": "1.0.0",
                "name": bridge,
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": bridge,
                        "isGateway": True,
                        "ipMasq": False,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": str(subnet)}]],
                            "dataDir": str(tmp_path / "ipam"),
                        },
                    }
                ],
            }
        )
    )
    node, log_dir = f"node-{uuid.uuid4().hex[:8]}", tmp_path / "logs"
    try:
        with (
            agents.containerd_namespace(containerd, "gvcni", handler_rig_archive) as ctr_ns,
            agents.agent_fleet(containerd, ctr_ns, log_dir) as fleet,
        ):
            fleet.start(
                kube, namespace, node, capacity_memory="1Gi", network_mode="cni",
                cni_conf_dir=str(conf_dir), cni_bin_dir=":".join(bin_dirs), cni_timeout="10s",
            )  # fmt: skip
            rig = HandlerRig(kube, namespace, node, ctr_ns, log_dir)
            try:
                with runtime_class(kube, "gvisor") as gvisor_class:
                    name = rig.run(CNI_SERVER, runtimeClassName=gvisor_class)
                    sandbox = rig.wait(name, "Running")
                    out = rig.output(name, DONE)
                assert "hello-from-gvisor" in out, out
                address = sandbox["status"]["ip"]
                assert ipaddress.IPv4Address(address) in subnet, sandbox["status"]
                # Inside, gVisor's own interfaces: the loopback and the veth's address.
                assert "inet 127.0.0.1/8" in out and f"inet {address}/24" in out, out
                page = wait_for(
                    lambda: _get(f"http://{address}:8081/index.html"),
                    timeout=30,
                    what=f"the gVisor sandbox's page at {address}:8081 (its log: {out!r})",
                )
                assert page.strip() == "hello-from-gvisor", page
            finally:
                agents.delete_node(kube, node)
    finally:
        subprocess.run(["ip", "link", "del", bridge], capture_output=True, check=False, timeout=30)


def _get(url: str) -> str | None:
    """The page at ``url`` (this host's own request, no proxy); failing, an
    AssertionError saying why (``wait_for`` retries it)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url, timeout=2) as answer:
            return str(answer.read().decode())
    except OSError as exc:
        raise AssertionError(f"GET {url}: {exc}") from None
