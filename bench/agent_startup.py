"""Agent start-up time with many orphans, some behind wedged shims, against its bound.

Starts a private containerd and a local control plane, fills an agent namespace
with N orphan containers (running ``sleep``), stops (SIGSTOP) the shims of W of
them, then times ``Agent.start()``: connect, sweep, re-adopt, first Lease
renewal. Prints the time and its ratio to the configured teardown bound
(kill_wait + 4 x call_timeout), which is what one wedged shim may cost.

    sudo .venv/bin/python bench/agent_startup.py [--orphans 200] [--wedged 5]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry
from tests.support.containerd import (
    find_shim_pid,
    scratch_spec,
    start_private_containerd,
    stopped_process,
)

from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.main import Agent
from sandlot.agent.netsettings import NetworkMode
from sandlot.agent.settings import AgentSettings
from sandlot.agent.teardown import teardown_many
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.ociarchive import build_image_archive, import_archive

IMAGE = "docker.io/sandlot/bench-busybox:1"
NAMESPACE = f"sandlot-bench-{uuid.uuid4().hex[:6]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orphans", type=int, default=200)
    parser.add_argument("--wedged", type=int, default=5)
    parser.add_argument("--kill-wait", type=float, default=10.0)
    parser.add_argument("--call-timeout", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sl-bench-"))
    containerd = start_private_containerd()
    plane = ControlPlane(workdir=work / "cp")
    plane.start()
    api = load_api_client(str(plane.kubeconfig))
    try:
        apply_crds(api, [crd_for(k) for k in KINDS])
        archive = work / "busybox.tar"
        build_image_archive(archive, IMAGE)
        import_archive(containerd.address, NAMESPACE, archive, timeout=120)
        rt = ContainerdRuntime(containerd.address, NAMESPACE)

        def make(i: int) -> tuple[str, int]:
            cid = f"orphan-{i:04d}"
            spec = scratch_spec(["sleep", "1000"], cid, host_network=True)
            rt.create_container(
                ContainerSpec(
                    id=cid, image=IMAGE, oci_spec=spec, labels={"sandlot.dev/sandbox": f"x/o{i}"}
                ),
                timeout=30,
            )
            return cid, rt.start_task(cid, stdio="", timeout=30).pid

        began = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            made = list(pool.map(make, range(args.orphans)))
        print(f"created {len(made)} orphan containers in {time.monotonic() - began:.1f}s")
        shims = [find_shim_pid(containerd.address, cid, pid) for cid, pid in made[: args.wedged]]

        settings = AgentSettings(
            default_ephemeral_storage_limit="",  # not about disk: no node-wide limit
            node_name="bench-node",
            namespace="default",
            containerd_address=containerd.address,
            containerd_namespace=NAMESPACE,
            containerd_root=str(containerd.root),
            kill_wait=args.kill_wait,
            call_timeout=args.call_timeout,
            teardown_concurrency=args.concurrency,
            metrics_port=0,
            log_dir="",
            node_address="127.0.0.1",
            network_mode=NetworkMode.HOST_ADDRESS,  # whatever the host's /etc/cni/net.d holds
        )
        agent = Agent(settings, api, registry=CollectorRegistry())
        bound = settings.teardown_bound
        with contextlib.ExitStack() as stack:
            for shim in shims:
                stack.enter_context(stopped_process(shim))
            began = time.monotonic()
            ok = agent.start()
            elapsed = time.monotonic() - began
        agent.shutdown()
        clean = args.orphans - args.wedged
        report = agent.sweep_report
        print(
            f"start-up: {elapsed:.2f}s (ready={ok}) with {args.orphans} orphans, "
            f"{args.wedged} wedged, concurrency {args.concurrency}"
        )
        if report is not None:
            outcomes: dict[str, int] = {}
            for r in report.teardowns:
                outcomes[r.outcome.value] = outcomes.get(r.outcome.value, 0) + 1
            print(f"sweep: {report.elapsed:.2f}s, teardown outcomes {outcomes}")
        print(
            f"teardown bound (kill_wait {args.kill_wait:g}s + 4 x call_timeout "
            f"{args.call_timeout:g}s) = {bound:g}s; wedged rounds = "
            f"{math.ceil(args.wedged / args.concurrency)}; clean teardowns = {clean}"
        )
        print(f"ratio start-up / bound = {elapsed / bound:.2f}")
        left = [c.id for c in rt.list_containers(timeout=30)]
        teardown_many(rt, left, kill_wait=5, call_timeout=5, concurrency=8)
        rt.close()
    finally:
        api.close()
        plane.stop()
        containerd.stop()
        containerd.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
