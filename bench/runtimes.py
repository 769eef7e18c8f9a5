"""What each runtime handler costs, runc against the others, in one run.

Starts a private containerd 2.x (declaring crun and, once built, gVisor, as the
tests' does), a local control plane and an in-process agent; one RuntimeClass per
handler the agent publishes.
For each handler, one after the other on the same machine:

- start: ``--starts`` sandboxes created one at a time, bound to the agent's node,
  each timed from just before the create call to the moment a watch sees it
  Running (p50, p99);
- exec: ``--execs`` round trips of ``true`` in one of them through containerd's
  ``Tasks.Exec`` (start, output closed, exit), p50;
- memory per idle sandbox: the mean, over those sandboxes, of the sandbox's cgroup
  memory use and of its shim's resident memory;
- syscall-heavy: ``dd bs=1`` of 200,000 bytes (two syscalls a byte) inside, and
  file-heavy: 2,000 files written and removed on the root filesystem inside; the
  median wall time of three runs each.

Rows print as they come, then a table with each handler's ratio to runc. Figures
from one run on one machine: compare handlers, not runs.

    sudo .venv/bin/python bench/runtimes.py [--starts 10] [--execs 20] [--json rows.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from prometheus_client import CollectorRegistry
from tests.support.agents import agent_settings, schedule_sandbox
from tests.support.containerd import find_shim_pid, start_private_containerd
from tests.support.containerd_fixtures import LINE_2

from bench.start_latency import NS, RunningWatch, percentile
from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.containerd.execs import Execs, open_execs
from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.agent.main import Agent
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.teardown import teardown_many
from sandlot.api import GROUP, VERSION
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.ociarchive import build_image_archive, import_archive

IMAGE = "docker.io/sandlot/bench-runtimes:1"
LEASE_NS = "sandlot-system"
NODE = "bench-runtimes"
SYSCALLS = ["dd", "if=/dev/zero", "of=/dev/null", "bs=1", "count=200000"]
FILES = [
    "sh",
    "-c",
    "mkdir /w && cd /w && i=0; while [ $i -lt 2000 ]; do echo x > f$i; i=$((i+1)); done;"
    " cd / && rm -r /w",
]


def exec_seconds(execs: Execs, container: str, argv: list[str], timeout: float = 300) -> float:
    """Wall time of one exec, start to exit with its output drained; it must succeed."""
    exec_id = f"b{uuid.uuid4().hex[:10]}"
    began = time.monotonic()
    process = execs.start(container, exec_id, argv, tty=False, stdin=False, timeout=30)
    try:
        while os.read(process.stdout, 65536):
            pass
        code = execs.wait(process, timeout=timeout)
    finally:
        process.release()
    elapsed = time.monotonic() - began
    with contextlib.suppress(Exception):
        execs.delete(container, exec_id, timeout=10)
    if code != 0:
        raise RuntimeError(f"{argv} exited {code} in {container}")
    return elapsed


def cgroup_memory(container: str) -> int:
    """Bytes the container's cgroup uses (v1 usage_in_bytes, or v2 memory.current)."""
    for pattern in (
        f"memory/**/{container}/memory.usage_in_bytes",
        f"**/{container}/memory.current",
    ):
        found = next(Path("/sys/fs/cgroup").glob(pattern), None)
        if found is not None:
            return int(found.read_text())
    raise LookupError(f"no memory cgroup for {container}")


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def runtime_class(api: client.ApiClient, handler: str) -> str:
    name = f"bench-{handler}"
    body: Any = {
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": name},
        "handler": handler,
    }
    client.NodeV1Api(api).create_runtime_class(body)
    return name


def measure(
    handler: str, args: argparse.Namespace, api: client.ApiClient, execs: Execs, address: str
) -> dict[str, float]:
    rc = runtime_class(api, handler)
    watcher = RunningWatch(api)
    try:
        starts, names = [], []
        for i in range(args.starts):
            name = f"{handler}-{i}"
            began = time.monotonic()
            schedule_sandbox(
                api,
                NS,
                name,
                NODE,
                {"image": IMAGE, "command": ["sleep", "100000"], "runtimeClassName": rc},
            )
            starts.append(watcher.wait([name], timeout=120)[name] - began)
            names.append(name)
        objs: Any = client.CustomObjectsApi(api)
        ids = [
            container_id_for(
                objs.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes", n)["metadata"][
                    "uid"
                ]
            )
            for n in names
        ]
        time.sleep(2)  # idle: their processes settled
        memory = statistics.mean(cgroup_memory(c) for c in ids)
        shims = statistics.mean(rss(find_shim_pid(address, c)) for c in ids)
        first = ids[0]
        exec_seconds(execs, first, ["true"])  # warm
        execs_taken = [exec_seconds(execs, first, ["true"]) for _ in range(args.execs)]
        syscalls = statistics.median(exec_seconds(execs, first, SYSCALLS) for _ in range(3))
        files = statistics.median(exec_seconds(execs, first, FILES) for _ in range(3))
        for n in names:
            objs.delete_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes", n)
    finally:
        watcher.stop()
    row = {
        "start p50 ms": 1000 * percentile(starts, 0.5),
        "start p99 ms": 1000 * percentile(starts, 0.99),
        "exec p50 ms": 1000 * percentile(execs_taken, 0.5),
        "idle cgroup MiB": memory / 2**20,
        "idle shim MiB": shims / 2**20,
        "syscall-heavy ms": 1000 * syscalls,
        "file-heavy ms": 1000 * files,
    }
    print(f"{handler}: " + ", ".join(f"{k} {v:.1f}" for k, v in row.items()), flush=True)
    return row


def wait_gone(rt: ContainerdRuntime, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while rt.list_containers(timeout=30):
        if time.monotonic() > deadline:
            raise TimeoutError("the sandboxes' containers were not torn down in time")
        time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--execs", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sl-bench-rt-"))
    containerd = start_private_containerd(line=LINE_2)
    plane = ControlPlane(workdir=work / "cp")
    plane.start()
    api = load_api_client(str(plane.kubeconfig), pool_size=8)
    ctr_ns = f"bench-rt-{uuid.uuid4().hex[:6]}"
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    execs = open_execs(containerd.address, ctr_ns, str(work / "fifos"))
    agent: Agent | None = None
    rows: dict[str, dict[str, float]] = {}
    try:
        apply_crds(api, [crd_for(k) for k in KINDS])
        core = client.CoreV1Api(api)
        for ns in (NS, LEASE_NS):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        build_image_archive(work / "image.tar", IMAGE)
        import_archive(containerd.address, ctr_ns, work / "image.tar", timeout=120)
        settings = agent_settings(
            node=NODE,
            namespace=LEASE_NS,
            containerd=containerd,
            ctr_ns=ctr_ns,
            log_dir=work / "logs",
            call_timeout="30s",
            gc_disabled=True,
            capacity_memory="64Gi",
        )
        agent = Agent(settings, api, registry=CollectorRegistry())
        assert agent.start(), "the agent did not start"
        handlers = sorted(agent.parts.work.facts.runtimes.names, key=lambda h: (h != "runc", h))
        print(f"handlers offered: {', '.join(handlers)}; load {os.getloadavg()[0]:.1f}")
        for handler in handlers:
            rows[handler] = measure(handler, args, api, execs, containerd.address)
            wait_gone(rt)
        base = rows["runc"]
        print("\n| handler | " + " | ".join(base) + " |")
        print("|---" * (len(base) + 1) + "|")
        for handler, row in rows.items():
            cells = [
                f"{v:.1f}" + (f" ({v / base[k]:.2f}x)" if handler != "runc" and base[k] else "")
                for k, v in row.items()
            ]
            print(f"| {handler} | " + " | ".join(cells) + " |")
        print(f"load average at the end: {os.getloadavg()[0]:.1f}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
    finally:
        if agent is not None:
            agent.shutdown()
        with contextlib.suppress(Exception):
            ids = [c.id for c in rt.list_containers(timeout=30)]
            teardown_many(rt, ids, kill_wait=5, call_timeout=10, concurrency=8)
        execs.close()
        rt.close()
        api.close()
        plane.stop()
        containerd.stop()
        containerd.remove()
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
