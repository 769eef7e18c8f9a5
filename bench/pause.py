"""What pausing and suspending a sandbox cost through sandlot, against containerd
called bare for the same work, in one run.

Starts a private containerd, a local control plane and an in-process agent, then:

- pause round trip: ``spec.operatingMode`` set to Paused, then back to Running, each
  waited for until the sandbox's ``Paused`` condition says so (a watch), against
  containerd's ``Tasks.Pause`` then ``Tasks.Resume`` called on a container of the same
  image (p50, p99 of ``--rounds`` each); and the API's own share of it: the same
  spec writes and one status write each, seen by the same watch, on a Sandbox no
  agent holds (a pause that says so in the API costs at least that); and the bare
  calls again, spaced as the one-at-a-time rounds are (a call after a quiet second
  does not cost what one in a warm loop does), beside them for comparison;
- suspend: a sandbox that wrote ``--mib`` MiB of random bytes suspended (until its
  ``Suspended`` condition is True), against ``commit_container`` (containerd's Diff
  service, a layer, an image: what the agent calls) on a container that wrote the
  same; ``--suspends`` rounds, each with fresh ones, which goes first alternating;
- resume from the committed image to Running again, against a cold start of the
  image (create to Running, seen by the same kind of watch); medians;
- fork of 20: a sandbox prepares a tree of ``--fork-mib`` MiB in 256 KiB files (what
  ``pip install`` leaves), a SandboxSnapshot of it is taken (its time to Ready is
  printed), then 20 sandboxes with ``spec.snapshotRef`` are created at once, against
  20 cold starts of the base image created at once: the time until all 20 are
  Running (each fork's tree is counted, through its process's root). The bench
  plays the operator (binds the snapshot and the sandboxes to its one node).

Targets (pause round trip <= 1.2x bare + the API's share, p50 and p99; suspend <= 1.2x
bare commit; resume <= 1.5x cold start) print beside each ratio. Figures from one run
on one machine: compare the rows of a run, not runs. ``--pause-only`` runs the pause
rows alone (the suspend and fork rows take minutes).

    sudo .venv/bin/python bench/pause.py [--rounds 20] [--mib 100] [--suspends 3] \
        [--fork-mib 20] [--pause-only]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client, watch
from prometheus_client import CollectorRegistry
from tests.support.agents import agent_settings, schedule_sandbox
from tests.support.containerd import scratch_cgroup, start_private_containerd

from bench.runtimes import exec_seconds
from bench.start_latency import NS, percentile
from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.containerd.execs import open_execs
from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.adapters.runtime import ContainerSpec
from sandlot.agent.main import Agent
from sandlot.agent.sandboxes import container_id_for
from sandlot.agent.teardown import teardown_many
from sandlot.api import GROUP, VERSION
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.ociarchive import build_image_archive, import_archive
from sandlot.policy.ocispec import default_spec

IMAGE = "docker.io/sandlot/bench-pause:1"
LEASE_NS = "sandlot-system"
NODE = "bench-pause"
SPACING = 1.0  # seconds between one-at-a-time pause rounds: a user pausing now and then
WAIT = 180.0  # seconds any one state change may take before the bench gives up
COUNTER = ["sh", "-c", "i=0; while true; do i=$((i+1)); sleep 0.1; done"]
FORKS = 20
SLEEPER = ["sleep", "100000"]
TREE_FILE_KIB = 256


def write_mib(mib: int) -> list[str]:
    return ["sh", "-c", f"dd if=/dev/urandom of=/state bs=1M count={mib} 2>/dev/null && sync"]


class Sandboxes:
    """Sandboxes of the bench's namespace: create, set the mode, wait for a state."""

    def __init__(self, api: client.ApiClient) -> None:
        self.objs: Any = client.CustomObjectsApi(api)

    def get(self, name: str) -> dict[str, Any]:
        return dict(self.objs.get_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes", name))

    def set_mode(self, name: str, mode: str) -> str:
        body = self.objs.patch_namespaced_custom_object(
            GROUP, VERSION, NS, "sandboxes", name, {"spec": {"operatingMode": mode}}
        )
        return str(body["metadata"]["resourceVersion"])

    def wait(
        self, name: str, since: str, done: Callable[[dict[str, Any]], bool], what: str
    ) -> float:
        """The monotonic time a watch from ``since`` first sees ``done``."""
        deadline = time.monotonic() + WAIT
        w = watch.Watch()
        try:
            for event in w.stream(
                self.objs.list_namespaced_custom_object,
                GROUP,
                VERSION,
                NS,
                "sandboxes",
                field_selector=f"metadata.name={name}",
                resource_version=since,
                timeout_seconds=int(WAIT),
            ):
                if done(event["object"]):
                    return time.monotonic()
                if time.monotonic() > deadline:
                    break
        finally:
            w.stop()
        raise TimeoutError(f"{name}: no {what} within {WAIT:.0f}s: {self.get(name).get('status')}")


def condition(body: dict[str, Any], kind: str) -> tuple[str, str] | None:
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return str(c.get("status")), str(c.get("reason"))
    return None


def running(body: dict[str, Any]) -> bool:
    return (body.get("status") or {}).get("phase") == "Running"


def start_sandbox(boxes: Sandboxes, api: client.ApiClient, name: str, command: list[str]) -> float:
    """Create ``name`` bound to the node; seconds from the create to Running."""
    began = time.monotonic()
    schedule_sandbox(api, NS, name, NODE, {"image": IMAGE, "command": command})
    body = boxes.get(name)
    if running(body):
        return time.monotonic() - began
    return boxes.wait(name, body["metadata"]["resourceVersion"], running, "Running") - began


def bare_container(rt: ContainerdRuntime, work: Path, command: list[str]) -> str:
    cid = f"bare-{uuid.uuid4().hex[:8]}"
    spec = default_spec(
        command, [], "/", host_network=True, hostname=cid, cgroups_path=scratch_cgroup(cid)
    )
    rt.create_container(ContainerSpec(id=cid, image=IMAGE, oci_spec=spec), timeout=60)
    rt.start_task(cid, stdio=f"file://{work / (cid + '.log')}", timeout=60)
    return cid


def pause_round(boxes: Sandboxes) -> float:
    began = time.monotonic()
    since = boxes.set_mode("paused", "Paused")
    boxes.wait("paused", since, lambda b: condition(b, "Paused") == ("True", "Paused"), "pause")
    since = boxes.set_mode("paused", "Running")
    boxes.wait("paused", since, lambda b: condition(b, "Paused") == ("False", "Resumed"), "resume")
    return time.monotonic() - began


def said_paused(said: tuple[str, str], body: dict[str, Any]) -> bool:
    return condition(body, "Paused") == said


def floor_round(boxes: Sandboxes) -> float:
    """What the API alone costs a pause round trip, on a Sandbox no agent holds (bound
    to no node): per half, the spec write, then the status write an agent would make,
    seen by a watch from the spec write as ``pause_round`` sees the agent's."""
    began = time.monotonic()
    for mode, status, reason in (("Paused", "True", "Paused"), ("Running", "False", "Resumed")):
        since = boxes.set_mode("floor", mode)
        said = {"type": "Paused", "status": status, "reason": reason, "message": "floor"}
        said["lastTransitionTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        boxes.objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, "sandboxes", "floor", {"status": {"conditions": [said]}}
        )
        boxes.wait("floor", since, partial(said_paused, (status, reason)), mode)
    return time.monotonic() - began


def bare_round(rt: ContainerdRuntime, cid: str) -> float:
    began = time.monotonic()
    rt.pause_task(cid, timeout=60)
    rt.resume_task(cid, timeout=60)
    return time.monotonic() - began


def pause_rows(
    boxes: Sandboxes, api: client.ApiClient, rt: ContainerdRuntime, work: Path, rounds: int
) -> dict[str, list[float]]:
    """Round trips back to back (each change of mode is handed to the sandbox's work
    from its watch event, with no sync pass beside it or after it), one at a time
    (``SPACING`` apart, as for a user pausing one sandbox now and then), the API's own
    share (``floor_round``) and containerd's bare calls spaced alike, and containerd's
    bare calls back to back (warm: each right after the last)."""
    start_sandbox(boxes, api, "paused", COUNTER)
    boxes.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "sandboxes",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": "floor"},
            "spec": {"image": IMAGE, "command": COUNTER},
        },
    )
    cid = bare_container(rt, work, COUNTER)
    out: dict[str, list[float]] = {"through": [pause_round(boxes) for _ in range(rounds)]}
    for name in ("spaced", "floor", "bare spaced"):
        out[name] = []
    for _ in range(rounds):
        time.sleep(SPACING)  # the spacing being measured, not a wait for a state
        out["spaced"].append(pause_round(boxes))
        time.sleep(SPACING)
        out["floor"].append(floor_round(boxes))
        time.sleep(SPACING)
        out["bare spaced"].append(bare_round(rt, cid))
    out["bare"] = [bare_round(rt, cid) for _ in range(rounds)]
    return out


def suspend_rows(
    boxes: Sandboxes,
    api: client.ApiClient,
    rt: ContainerdRuntime,
    work: Path,
    args: argparse.Namespace,
    address: str,
    ctr_ns: str,
) -> dict[str, list[float]]:
    """Each round: a fresh sandbox and a fresh bare container write ``--mib`` MiB; the
    sandbox is suspended and restored, the container committed (which goes first
    alternates), and one more sandbox is cold-started."""
    out: dict[str, list[float]] = {"suspend": [], "bare commit": [], "restore": [], "cold": []}
    execs = open_execs(address, ctr_ns, str(work / "fifos"))
    try:
        for i in range(args.suspends):
            name = f"stored-{i}"
            start_sandbox(boxes, api, name, ["sleep", "100000"])
            stored = container_id_for(boxes.get(name)["metadata"]["uid"])
            exec_seconds(execs, stored, write_mib(args.mib))
            cid = bare_container(rt, work, ["sleep", "100000"])
            exec_seconds(execs, cid, write_mib(args.mib))
            if i % 2 == 0:
                suspend_one(boxes, name, out)
                commit_one(rt, cid, out)
            else:
                commit_one(rt, cid, out)
                suspend_one(boxes, name, out)
            began = time.monotonic()
            since = boxes.set_mode(name, "Running")
            restored = boxes.wait(
                name,
                since,
                lambda b: condition(b, "Suspended") == ("False", "Restored") and running(b),
                "restore",
            )
            out["restore"].append(restored - began)
            out["cold"].append(start_sandbox(boxes, api, f"cold-{i}", ["sleep", "100000"]))
    finally:
        execs.close()
    return out


def suspend_one(boxes: Sandboxes, name: str, out: dict[str, list[float]]) -> None:
    began = time.monotonic()
    since = boxes.set_mode(name, "Suspended")
    ended = boxes.wait(
        name, since, lambda b: condition(b, "Suspended") == ("True", "Suspended"), "suspend"
    )
    out["suspend"].append(ended - began)


def commit_one(rt: ContainerdRuntime, cid: str, out: dict[str, list[float]]) -> None:
    began = time.monotonic()
    rt.commit_container(cid, f"sandlot.local/bench/{cid}:latest", {}, timeout=600)
    out["bare commit"].append(time.monotonic() - began)


def prepare_tree(files: int) -> list[str]:
    return [
        "sh",
        "-c",
        "mkdir -p /opt/venv/lib && cd /opt/venv/lib && for i in $(seq 1 "
        f"{files}); do head -c {TREE_FILE_KIB * 1024} /dev/urandom > m$i.so; done && "
        "touch /opt/venv/READY; sleep 100000",
    ]


def poll(what: str, done: Callable[[], Any]) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if value := done():
            return value
        time.sleep(0.05)
    raise TimeoutError(f"no {what} within {WAIT:.0f}s")


def all_running(boxes: Sandboxes, group: str) -> list[dict[str, Any]] | None:
    items = boxes.objs.list_namespaced_custom_object(
        GROUP, VERSION, NS, "sandboxes", label_selector=f"bench={group}"
    )["items"]
    return items if len(items) == FORKS and all(running(b) for b in items) else None


def start_group(boxes: Sandboxes, api: client.ApiClient, group: str, spec: dict[str, Any]) -> float:
    """Seconds from the first of ``FORKS`` creates to all of them Running."""
    began = time.monotonic()
    for i in range(FORKS):
        schedule_sandbox(api, NS, f"{group}-{i}", NODE, spec, labels={"bench": group})
    poll(f"{FORKS} {group} sandboxes Running", lambda: all_running(boxes, group))
    return time.monotonic() - began


def fork_rows(boxes: Sandboxes, api: client.ApiClient, mib: int) -> dict[str, float]:
    """The snapshot's time to Ready, 20 forks to Running, 20 cold starts to Running."""
    files = mib * 1024 // TREE_FILE_KIB
    start_sandbox(boxes, api, "prepared", prepare_tree(files))
    pid = boxes.get("prepared")["status"]["pid"]
    poll("prepared tree", lambda: Path(f"/proc/{pid}/root/opt/venv/READY").exists())
    began = time.monotonic()
    boxes.objs.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "sandboxsnapshots",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxSnapshot",
            "metadata": {"name": "prepared"},
            "spec": {"sandboxName": "prepared", "nodeName": NODE},  # as the operator binds it
        },
    )

    def ready() -> bool:
        body = boxes.objs.get_namespaced_custom_object(
            GROUP, VERSION, NS, "sandboxsnapshots", "prepared"
        )
        phase = (body.get("status") or {}).get("phase")
        if phase == "Failed":
            raise RuntimeError(f"snapshot failed: {body['status']}")
        return phase == "Ready"

    poll("snapshot Ready", ready)
    out = {"snapshot": time.monotonic() - began}
    fork = {"image": IMAGE, "command": SLEEPER, "snapshotRef": {"name": "prepared"}}
    out["fork"] = start_group(boxes, api, "fork", fork)
    for body in all_running(boxes, "fork") or []:
        tree = Path(f"/proc/{body['status']['pid']}/root/opt/venv/lib")
        if len(list(tree.iterdir())) != files:
            raise RuntimeError(f"{body['metadata']['name']} does not see the prepared tree")
    out["cold"] = start_group(boxes, api, "cold20", {"image": IMAGE, "command": SLEEPER})
    return out


def pause_report_rows(
    measured: dict[str, list[float]],
) -> list[tuple[str, float, float, float | None]]:
    """The pause rows: each round trip against its floor, containerd's bare calls plus
    the API's own share at the same percentile (the p99 floor is the two p99s added);
    last, the round trips one at a time against bare calls spaced alike (containerd's
    calls back to back run warm; one after a second's quiet costs otherwise)."""
    through, spaced, bare, floor = (measured[k] for k in ("through", "spaced", "bare", "floor"))
    bare_spaced = measured["bare spaced"]

    def ms(values: list[float], q: float) -> float:
        return 1000 * percentile(values, q)

    def floor_at(q: float, calls: list[float] = bare) -> float:
        return ms(calls, q) + ms(floor, q)

    return [
        ("pause+resume back to back p50 (ms), against bare", ms(through, 0.5), ms(bare, 0.5), None),
        (
            "API floor: spec write + status write seen by a watch, twice, p50 (ms), against bare",
            ms(floor, 0.5),
            ms(bare, 0.5),
            None,
        ),
        ("pause+resume back to back p50 (ms)", ms(through, 0.5), floor_at(0.5), 1.2),
        ("pause+resume back to back p99 (ms)", ms(through, 0.99), floor_at(0.99), 1.2),
        (
            f"pause+resume one at a time ({SPACING:.0f} s apart) p50 (ms)",
            ms(spaced, 0.5),
            floor_at(0.5),
            1.2,
        ),
        (
            f"pause+resume one at a time ({SPACING:.0f} s apart) p99 (ms)",
            ms(spaced, 0.99),
            floor_at(0.99),
            1.2,
        ),
        (
            f"bare Pause+Resume one at a time ({SPACING:.0f} s apart) p50 (ms), against bare",
            ms(bare_spaced, 0.5),
            ms(bare, 0.5),
            None,
        ),
        (
            "pause+resume one at a time p50 (ms), against bare one at a time + API floor",
            ms(spaced, 0.5),
            floor_at(0.5, bare_spaced),
            None,
        ),
        (
            "pause+resume one at a time p99 (ms), against bare one at a time + API floor",
            ms(spaced, 0.99),
            floor_at(0.99, bare_spaced),
            None,
        ),
    ]


def report(
    pause_rows: list[tuple[str, float, float, float | None]],
    suspended: dict[str, list[float]] | None,
    forked: dict[str, float] | None,
) -> None:
    rows = list(pause_rows)
    if suspended is not None and forked is not None:
        med = {k: statistics.median(v) for k, v in suspended.items()}
        rows += [
            ("suspend, median (ms)", 1000 * med["suspend"], 1000 * med["bare commit"], 1.2),
            ("resume from the image, median (ms)", 1000 * med["restore"], 1000 * med["cold"], 1.5),
            (
                f"fork of {FORKS} to Running (ms)",
                1000 * forked["fork"],
                1000 * forked["cold"],
                None,
            ),
        ]
    print("\n| what | sandlot | against | ratio | target |")
    print("|---|---|---|---|---|")
    for what, ours, theirs, target in rows:
        ratio = ours / theirs if theirs else float("inf")
        verdict = (
            "-" if target is None else f"<= {target}x " + ("met" if ratio <= target else "missed")
        )
        print(f"| {what} | {ours:.1f} | {theirs:.1f} | {ratio:.2f}x | {verdict} |")
    print(
        "against: containerd's Pause+Resume called bare plus the API's own share (the "
        "same spec and status writes seen by a watch, on a Sandbox no agent holds), where "
        "the row does not say bare alone"
        + (
            "; commit_container called bare on a container that wrote the same; a cold "
            f"start of the image (create to Running); {FORKS} cold starts of the base image "
            "created at once"
            if suspended is not None
            else ""
        )
    )
    if forked is not None:
        print(f"snapshot of the prepared tree to Ready: {1000 * forked['snapshot']:.0f} ms")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--suspends", type=int, default=3)
    parser.add_argument("--fork-mib", type=int, default=20)
    parser.add_argument(
        "--pause-only", action="store_true", help="the pause rows alone (no suspend, no fork)"
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sl-bench-pause-"))
    containerd = start_private_containerd()
    plane = ControlPlane(workdir=work / "cp")
    plane.start()
    api = load_api_client(str(plane.kubeconfig), pool_size=8)
    ctr_ns = f"bench-pause-{uuid.uuid4().hex[:6]}"
    rt = ContainerdRuntime(containerd.address, ctr_ns)
    agent: Agent | None = None
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
            call_timeout="60s",
            gc_disabled=True,
            capacity_memory="64Gi",
        )
        agent = Agent(settings, api, registry=CollectorRegistry())
        assert agent.start(), "the agent did not start"
        boxes = Sandboxes(api)
        print(f"containerd {containerd.line}; load {os.getloadavg()[0]:.1f}", flush=True)
        measured = pause_rows(boxes, api, rt, work, args.rounds)
        print(
            "pause round trips: " + ", ".join(f"{k} {len(v)}" for k, v in measured.items()),
            flush=True,
        )
        paused = pause_report_rows(measured)
        if args.pause_only:
            report(paused, None, None)
            return 0
        suspended = suspend_rows(boxes, api, rt, work, args, containerd.address, ctr_ns)
        print(
            "suspend rounds: "
            + "; ".join(
                f"{k} " + ", ".join(f"{1000 * v:.0f}" for v in vs) for k, vs in suspended.items()
            )
            + " (ms)",
            flush=True,
        )
        forked = fork_rows(boxes, api, args.fork_mib)
        report(paused, suspended, forked)
    finally:
        if agent is not None:
            agent.shutdown()
        with contextlib.suppress(Exception):
            ids = [c.id for c in rt.list_containers(timeout=30)]
            teardown_many(rt, ids, kill_wait=5, call_timeout=10, concurrency=8)
        rt.close()
        api.close()
        plane.stop()
        containerd.stop()
        containerd.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
