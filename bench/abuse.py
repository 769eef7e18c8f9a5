"""What hostile tenants cost the agent: its peak resident memory and its CPU while
10 hostile images and 10 log floods run, against the same agent idle, in one run.

Starts a private containerd, a local control plane, a hostile registry on loopback
(``tests/support/hostile.py``) and the agent as its own process (``sandlot agent``,
as the DaemonSet runs it), then samples the agent's ``/proc/<pid>`` every 100 ms:

- idle: the agent registered, holding one quiet sandbox, for ``--idle`` seconds;
- abuse: 4 sandboxes of a gzip-bomb image under ``USER nobody`` (2 GiB of zeros in
  one layer), 6 from the hostile registry (a 100 MiB manifest, a config of 1 GiB by
  its descriptor, a config that says 1000 bytes and sends 1 GiB; two of each), and
  10 sandboxes writing their stdout as fast as they can without a newline
  (``cat /dev/zero``), for ``--flood`` seconds after the last of them runs.

The agent's peak resident set in the abuse phase (VmHWM, reset when it begins)
against its median idle resident set, target < 2x; its CPU in cores in each phase
(reported: the floods' bytes are the agent's to write); restarts, target 0 (the
agent is one process: it must still be the same one, alive); each hostile sandbox's
end (reason); the largest log a flood kept on disk against the per-file cap.
Figures from one run on one machine: compare the rows of a run, not runs.

    sudo .venv/bin/python bench/abuse.py [--idle 15] [--flood 20]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from tests.support import hostile
from tests.support.agents import schedule_sandbox
from tests.support.containerd import PrivateContainerd, start_private_containerd

from bench.start_latency import NS
from sandlot.adapters.containerd import ContainerdRuntime
from sandlot.adapters.kube import apply_crds, load_api_client
from sandlot.agent.teardown import teardown_many
from sandlot.api import GROUP, VERSION
from sandlot.api.crdgen import KINDS, crd_for
from sandlot.devtools.controlplane import ControlPlane
from sandlot.devtools.ociarchive import build_image_archive, import_archive

IMAGE = "docker.io/sandlot/bench-abuse:1"
BOMB = "docker.io/sandlot/bench-bomb:1"
LIES = ("huge-manifest", "huge-config", "lying-config")
LEASE_NS = "sandlot-system"
NODE = "bench-abuse"
LOG_MAX = 8 * 2**20  # the agent's per-file log cap in this run (--log-max-bytes)
WAIT = 180.0  # seconds any one wait may take before the bench gives up
SAMPLE = 0.1
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Samples:
    """The agent process's resident set (bytes) and CPU time (seconds), sampled."""

    pid: int
    rss: list[int] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def status_field(self, name: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(name + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {name} in /proc/{self.pid}/status")

    def cpu_seconds(self) -> float:
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime

    def reset_peak(self) -> None:
        """The kernel resets VmHWM to the current resident set."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def run(self) -> None:
        while not self.stop.wait(SAMPLE):
            with contextlib.suppress(OSError, RuntimeError):
                self.rss.append(self.status_field("VmRSS"))


@dataclass
class Phase:
    seconds: float
    cpu: float
    rss: list[int]
    peak: int

    @property
    def cores(self) -> float:
        return self.cpu / self.seconds if self.seconds else 0.0


def measure(samples: Samples, body: Any) -> Phase:
    """Run ``body()`` while sampling; the phase's wall time, CPU and resident sets."""
    samples.rss = []
    samples.reset_peak()
    cpu0, began = samples.cpu_seconds(), time.monotonic()
    sampler = threading.Thread(target=samples.run, daemon=True)
    samples.stop.clear()
    sampler.start()
    try:
        body()
    finally:
        samples.stop.set()
        sampler.join(timeout=5)
    took = time.monotonic() - began
    return Phase(took, samples.cpu_seconds() - cpu0, samples.rss, samples.status_field("VmHWM"))


def start_agent(work: Path, kubeconfig: Path, containerd: PrivateContainerd, ctr_ns: str) -> Any:
    argv = [
        *(sys.executable, "-m", "sandlot.cli.main", "agent"),
        *("--kubeconfig", str(kubeconfig), "--node", NODE, "--namespace", LEASE_NS),
        *("--node-address", "10.9.8.7", "--containerd-address", containerd.address),
        *("--containerd-namespace", ctr_ns, "--containerd-root", str(containerd.root)),
        *("--containerd-config", str(containerd.config_path)),
        *("--log-dir", str(work / "logs"), "--state-dir", str(work / "state")),
        *("--registry-private-hosts", "127.0.0.1", "--log-max-bytes", str(LOG_MAX)),
        *("--call-timeout", "10s", "--capacity", "40", "--capacity-memory", "64Gi"),
        "--gc-disabled",
        *("--network-mode", "host-address"),  # whatever the host's /etc/cni/net.d holds
    ]
    out = (work / "agent.log").open("wb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)


def wait_logged(work: Path, needle: str) -> None:
    deadline = time.monotonic() + WAIT
    log = work / "agent.log"
    while time.monotonic() < deadline:
        if needle in log.read_text(errors="replace"):
            return
        time.sleep(0.2)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise TimeoutError(f"the agent did not log {needle!r} within {WAIT:.0f}s:\n{tail}")


class Sandboxes:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.objs: Any = client.CustomObjectsApi(api)

    def create(self, name: str, spec: dict[str, Any]) -> None:
        schedule_sandbox(self.api, NS, name, NODE, spec)

    def phases(self) -> dict[str, dict[str, Any]]:
        items = self.objs.list_namespaced_custom_object(GROUP, VERSION, NS, "sandboxes")["items"]
        return {i["metadata"]["name"]: dict(i.get("status") or {}) for i in items}

    def wait(self, names: list[str], done: set[str], what: str) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + WAIT
        while True:
            seen = self.phases()
            if all(seen.get(n, {}).get("phase") in done for n in names):
                return seen
            if time.monotonic() > deadline:
                late = {n: seen.get(n, {}).get("phase") for n in names}
                raise TimeoutError(f"not all {what} within {WAIT:.0f}s: {late}")
            time.sleep(0.5)


def abuse(boxes: Sandboxes, registry: str, flood: float) -> dict[str, dict[str, Any]]:
    hostile_names = [f"bomb-{i}" for i in range(4)]
    for name in hostile_names:
        boxes.create(name, {"image": BOMB})
    for i, repo in enumerate(LIES * 2):
        hostile_names.append(f"{repo}-{i}")
        boxes.create(hostile_names[-1], {"image": f"{registry}/{repo}:1"})
    floods = [f"flood-{i}" for i in range(10)]
    for name in floods:
        boxes.create(name, {"image": IMAGE, "command": ["sh", "-c", "cat /dev/zero"]})
    boxes.wait(floods, {"Running"}, "floods Running")
    time.sleep(flood)  # the floods run for this long: the abuse itself, not a wait
    ended = boxes.wait(hostile_names, {"Failed"}, "hostile sandboxes Failed")
    return {n: ended[n] for n in hostile_names}


def largest_log(work: Path) -> int:
    sizes = [p.stat().st_size for p in (work / "logs").rglob("*") if p.is_file()]
    return max(sizes, default=0)


def report(
    idle: Phase, hurt: Phase, ends: dict[str, dict[str, Any]], alive: bool, log: int
) -> None:
    idle_rss = statistics.median(idle.rss) if idle.rss else float(idle.peak)
    reasons = Counter(f"{s.get('phase')}/{s.get('reason')}" for s in ends.values())
    ratio = hurt.peak / idle_rss
    print("\n| what | idle | under abuse | ratio | target |")
    print("|---|---|---|---|---|")
    verdict = "met" if ratio < 2 else "missed"
    print(
        f"| agent resident set (MiB): idle median, abuse peak | {idle_rss / 2**20:.1f} | "
        f"{hurt.peak / 2**20:.1f} | {ratio:.2f}x | < 2x {verdict} |"
    )
    print(f"| agent CPU (cores) | {idle.cores:.3f} | {hurt.cores:.3f} | - | - |")
    print(f"| agent restarts | 0 | {0 if alive else 1} | - | 0 {'met' if alive else 'missed'} |")
    print(
        f"| largest log file kept (MiB) | - | {log / 2**20:.1f} | - | "
        f"<= {LOG_MAX / 2**20:.0f} {'met' if log <= LOG_MAX else 'missed'} |"
    )
    print(f"hostile sandboxes' ends: {dict(reasons)}")
    for name, status in sorted(ends.items()):
        print(f"  {name}: {status.get('reason')}: {str(status.get('message'))[:140]}")
    print(f"phases: idle {idle.seconds:.1f}s, abuse {hurt.seconds:.1f}s")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


def run(args: argparse.Namespace, work: Path, containerd: PrivateContainerd) -> None:
    with ControlPlane(workdir=work / "cp") as plane, hostile.hostile_registry() as registry:
        api = load_api_client(str(plane.kubeconfig), pool_size=8)
        apply_crds(api, [crd_for(k) for k in KINDS])
        core = client.CoreV1Api(api)
        for ns in (NS, LEASE_NS):
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        ctr_ns = f"bench-abuse-{uuid.uuid4().hex[:6]}"
        build_image_archive(work / "image.tar", IMAGE)
        import_archive(containerd.address, ctr_ns, work / "image.tar", timeout=120)
        hostile.bomb_archive(work / "bomb.tar", BOMB)
        ctr = [containerd.ctr, "--address", containerd.address, "--namespace", ctr_ns]
        # Content only: unpacking would write the 2 GiB to disk; nothing runs it.
        subprocess.run(
            [*ctr, "images", "import", "--no-unpack", str(work / "bomb.tar")],
            check=True,
            capture_output=True,
            timeout=120,
        )
        agent = start_agent(work, plane.kubeconfig, containerd, ctr_ns)
        rt = ContainerdRuntime(containerd.address, ctr_ns)
        try:
            wait_logged(work, " ready after ")
            boxes = Sandboxes(api)
            boxes.create("quiet", {"image": IMAGE, "command": ["sleep", "3600"]})
            boxes.wait(["quiet"], {"Running"}, "quiet sandbox Running")
            samples = Samples(agent.pid)
            print(f"containerd {containerd.line}; load {os.getloadavg()[0]:.1f}", flush=True)
            idle = measure(samples, lambda: time.sleep(args.idle))
            ends: dict[str, dict[str, Any]] = {}
            hurt = measure(samples, lambda: ends.update(abuse(boxes, registry, args.flood)))
            report(idle, hurt, ends, agent.poll() is None, largest_log(work))
        finally:
            agent.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(timeout=30)
            agent.kill()
            with contextlib.suppress(Exception):
                ids = [c.id for c in rt.list_containers(timeout=30)]
                teardown_many(rt, ids, kill_wait=5, call_timeout=10, concurrency=8)
            rt.close()
            api.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--idle", type=float, default=15.0, help="seconds of the idle phase")
    parser.add_argument("--flood", type=float, default=20.0, help="seconds the floods run")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sl-bench-abuse-"))
    containerd = start_private_containerd()
    try:
        run(args, work, containerd)
    finally:
        containerd.stop()
        containerd.remove()
    return 0


if __name__ == "__main__":
    sys.exit(main())
