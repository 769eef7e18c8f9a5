"""Streams through the whole path against containerd's own, measured in one run.

A local control plane (with its front proxy), the stream gateway and one real agent
(both in this process) on a private containerd, and one Running sandbox. Each
figure is taken beside its floor, on the same node in the same run:

- exec round trip of ``true`` through the API server, the gateway and the agent
  (a WebSocket opened and read to its status, as the CLI or an SDK does) against
  ``ctr tasks exec`` of the same command (a process start included): p50 and p99,
  target p50 <= 1.3x;
- 50 execs at once, both ways: the wall time of the burst;
- 100 MiB into the sandbox by the files subresource against ``cat > file`` fed
  through the same exec path: target throughput >= 0.8x.

    sudo .venv/bin/python bench/streams.py [--execs 50] [--mib 100] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry
from tests.support.containerd import start_private_containerd

from bench.nodehealth import Bench
from sandlot.adapters.agentpods import publish_agent_pod
from sandlot.adapters.streamclient import open_stream
from sandlot.agent.main import Agent
from sandlot.agent.netsettings import NetworkMode
from sandlot.agent.settings import AgentSettings
from sandlot.api import GROUP, VERSION
from sandlot.devtools.certs import StreamCerts
from sandlot.devtools.controlplane import free_port
from sandlot.devtools.gatewayrig import running_gateway
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from sandlot.devtools.streamnet import StreamAddress
from sandlot.policy.streams import (
    EXEC,
    FILES,
    STATUS,
    STDIN,
    WRITE,
    StreamRequest,
    api_path,
    close_stdin_frame,
    decode_frame,
    encode_frame,
    end_of,
)

IMAGE = "docker.io/sandlot/bench-streams:1"
NODE = "bench-streams"
CHUNK = 64 * 1024


FAILURES: list[str] = []


def drain(stream: Any) -> int:
    status = None
    while (message := stream.recv()) is not None:
        channel, data = decode_frame(message)
        if channel == STATUS:
            status = data
    stream.close()
    end = end_of(status)
    if end.exit_code:
        FAILURES.append(end.message or f"exit {end.exit_code}")
    return end.exit_code


def timed(fn: Callable[[], object]) -> float:
    began = time.perf_counter()
    fn()
    return (time.perf_counter() - began) * 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextmanager
def real_node(
    bench: Bench,
    work: Path,
    node: str,
    image: str,
    agent: dict[str, Any] | None = None,
    gateway: dict[str, Any] | None = None,
) -> Iterator[tuple[Agent, str, str]]:
    """One real node on ``bench``'s control plane: a private containerd holding
    ``image``, the agent of SandboxNode ``node`` (in this process) and the stream
    gateway behind the API server. Yields the agent, containerd's address and the
    containerd namespace of the agent's sandboxes; stops them all on leaving."""
    containerd = start_private_containerd()
    address = StreamAddress().create()
    try:
        certs = StreamCerts.create(work / "certs", bench.lease_ns, (address.ip,))
        ctr_ns = f"bench-{uuid.uuid4().hex[:6]}"
        archive = work / "busybox.tar"
        build_image_archive(archive, image)
        import_archive(containerd.address, ctr_ns, archive, timeout=60)
        port = free_port()
        publish_agent_pod(bench.api, bench.lease_ns, f"agent-{node}", address.ip, port, node)
        settings = AgentSettings(
            default_ephemeral_storage_limit="",  # not about disk: no node-wide limit
            node_name=node,
            namespace=bench.lease_ns,
            containerd_address=containerd.address,
            containerd_namespace=ctr_ns,
            containerd_root=str(containerd.root),
            metrics_port=0,
            node_address="10.1.2.3",
            network_mode=NetworkMode.HOST_ADDRESS,  # whatever the host's /etc/cni/net.d holds
            log_dir=str(work / "logs"),
            stream_port=port,
            stream_bind=address.ip,
            stream_tls_cert=str(certs.agent(node).cert),
            stream_tls_key=str(certs.agent(node).key),
            stream_client_ca=str(certs.ca.cert),
            **(agent or {}),
        )
        started = Agent(settings, bench.api, registry=CollectorRegistry())
        assert started.start(), "the agent did not start"
        try:
            with running_gateway(bench.api, certs, bench.lease_ns, address.ip, **(gateway or {})):
                yield started, containerd.address, ctr_ns
        finally:
            started.shutdown()
    finally:
        address.remove()
        containerd.stop()
        containerd.remove()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=50)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sl-bench-streams-"))
    bench = Bench(work)
    burst = max(args.execs, 32)  # one user opens the whole burst
    try:
        with real_node(
            bench,
            work,
            NODE,
            IMAGE,
            agent={"stream_file_max_bytes": (args.mib + 1) * 2**20},
            gateway={"max_sessions": 2 * burst, "max_sessions_per_user": burst},
        ) as (agent, address, ctr_ns):
            rows = measure(bench, agent, address, ctr_ns, args)
    finally:
        bench.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows))
    return 0 if all(r["ok"] for r in rows) else 1


def measure(
    bench: Bench, agent: Agent, address: str, ctr_ns: str, args: argparse.Namespace
) -> list[dict[str, Any]]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "target"},
        "spec": {"image": IMAGE, "command": ["sleep", "100000"], "nodeName": NODE},
    }
    bench.objs.create_namespaced_custom_object(GROUP, VERSION, bench.ns, "sandboxes", body)
    bench.objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, bench.ns, "sandboxes", "target", {"status": {"phase": "Scheduled"}}
    )

    def running() -> bool:
        sb = agent.sandbox_watch.get(f"{bench.ns}/target") or {}
        return (sb.get("status") or {}).get("phase") == "Running"

    bench.wait(running, 60, "the sandbox Running")
    sandbox = agent.sandbox_watch.get(f"{bench.ns}/target") or {}
    container = sandbox["status"]["containerId"]
    run_true = api_path(StreamRequest(EXEC, bench.ns, "target", command=("true",)))

    def ours() -> None:
        try:
            drain(open_stream(bench.api, run_true))
        except Exception as e:
            FAILURES.append(f"{type(e).__name__}: {e}")

    ctr_failures: list[str] = []

    def floor() -> None:
        try:
            subprocess.run(
                ["ctr", "-a", address, "-n", ctr_ns, "tasks", "exec",
                 "--exec-id", f"b{uuid.uuid4().hex[:8]}", container, "true"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
        except subprocess.SubprocessError as e:
            ctr_failures.append(f"{type(e).__name__}: {e}")

    for warm in (ours, floor):
        warm()
    pairs = [(timed(ours), timed(floor)) for _ in range(args.execs)]
    ours_ms, floor_ms = [p[0] for p in pairs], [p[1] for p in pairs]
    rows: list[dict[str, Any]] = []

    def row(name: str, value: float, target: str, ok: bool, detail: str) -> None:
        bench.row(name, value, target, ok, detail)
        rows.append(bench.rows[-1])

    p50 = statistics.median(ours_ms) / statistics.median(floor_ms)
    row(
        "exec round trip p50 / ctr tasks exec",
        p50,
        "<= 1.3",
        p50 <= 1.3,
        f"ours p50 {statistics.median(ours_ms):.1f} ms p99 {pct(ours_ms, 0.99):.1f} ms; "
        f"ctr p50 {statistics.median(floor_ms):.1f} ms p99 {pct(floor_ms, 0.99):.1f} ms; "
        f"load {os.getloadavg()[0]:.2f}",
    )
    failed_before = len(FAILURES)
    burst: dict[str, float] = {}
    for name, fn in (("ours", ours), ("ctr", floor)):
        with ThreadPoolExecutor(args.execs) as pool:
            began = time.perf_counter()
            list(pool.map(lambda _, call=fn: call(), range(args.execs)))
            burst[name] = time.perf_counter() - began
    ratio = burst["ours"] / burst["ctr"]
    failed = FAILURES[failed_before:]
    row(
        f"{args.execs} execs at once: wall / ctr's",
        ratio,
        "report; every exec succeeds",
        not failed,
        f"ours {burst['ours']:.2f} s, ctr {burst['ctr']:.2f} s; {len(failed)} failed"
        + (f" (first: {failed[0]})" if failed else "")
        + f"; ctr: {len(ctr_failures)} failed"
        + (f" (first: {ctr_failures[0][:160]})" if ctr_failures else ""),
    )
    payload = os.urandom(2**20)
    total = args.mib * 2**20

    def send_all(stream: Any) -> int:
        for _ in range(args.mib):
            for i in range(0, len(payload), CHUNK):
                stream.send(encode_frame(STDIN, payload[i : i + CHUNK]))
        stream.send(close_stdin_frame())
        return drain(stream)

    write = api_path(StreamRequest(FILES, bench.ns, "target", op=WRITE, path="/tmp/copy"))
    cat = api_path(
        StreamRequest(EXEC, bench.ns, "target", command=("sh", "-c", "cat > /tmp/cat"), stdin=True)
    )
    files_s = timed(lambda: send_all(open_stream(bench.api, write))) / 1000
    cat_s = timed(lambda: send_all(open_stream(bench.api, cat))) / 1000
    ratio = cat_s / files_s
    row(
        f"{args.mib} MiB in by files / cat through exec (throughput)",
        ratio,
        ">= 0.8",
        ratio >= 0.8,
        f"files {total / files_s / 2**20:.1f} MiB/s, cat {total / cat_s / 2**20:.1f} MiB/s",
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
