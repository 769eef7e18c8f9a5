"""The fleet of the scale benchmark: many SandboxNodes, their agents' Leases renewed
by one process, many Sandboxes created fast, and what the bench reads back.

- ``python -m bench.scalefleet agents ...`` renews N node Leases the way N agents
  would (one PUT per renewal, spread evenly over the renew interval) and takes
  commands on stdin: ``pause NAME...`` stops renewing those Leases and answers one
  JSON line with each one's last renewTime; ``resume NAME...`` starts again;
  ``add NAME...`` creates and renews more; ``count`` answers the renewals sent.
- ``create_sandboxes`` spreads M Running Sandboxes over the nodes from several
  processes of concurrent clients (create, then the status subresource).
- ``OperatorRequests`` counts the operator's requests in the API server's audit
  log (the operator has a user of its own), so kopf's requests count too.
- ``DeadWatch`` times, from a watch, the moment each Sandbox is seen Dead.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import heapq
import http.client
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.mergepatch import MergePatcher
from sandlot.adapters.objects import LeaseRecord, Leases
from sandlot.api import GROUP, VERSION
from sandlot.api.keys import AGENT_LEASE_LABEL
from sandlot.api.reasons import SandboxReason
from sandlot.api.timestamps import rfc3339
from sandlot.devtools.controlplane import ADMIN_USER, kubeconfig_dict
from sandlot.policy.marking import dead_status

IMAGE = "example.test/busybox:1"


# -- the agents' Leases ---------------------------------------------------------------


class LeaseRenewer:
    """Renews many node Leases from one process, each every ``every`` seconds."""

    def __init__(self, kubeconfig: str, namespace: str, every: float, duration: int) -> None:
        self.api = load_api_client(kubeconfig, pool_size=16, request_timeout=(30.0, 120.0))
        self.leases = Leases(self.api, namespace)
        self.patcher = MergePatcher(self.api)
        self.namespace = namespace
        self.every, self.duration = every, duration
        self.records: dict[str, LeaseRecord] = {}
        self.last: dict[str, datetime] = {}
        # The longest time between two successful renewals of each node, on this
        # process's monotonic clock: a node whose renewals lapsed (an API server too
        # slow to answer, this process starved) was not live for that while.
        self.renewed_at: dict[str, float] = {}
        self.longest_gap: dict[str, float] = {}
        self.due: list[tuple[float, str]] = []  # a heap: (monotonic time, name)
        self.paused: set[str] = set()
        self.held: set[str] = set()  # paused names that came due
        self.renewals = 0
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(8)

    def add(self, names: list[str]) -> None:
        now = datetime.now(UTC)
        start = time.monotonic()

        def create(name: str) -> None:
            record = self.leases.get(name)
            if record is None:
                record = self.leases.create(
                    name,
                    holder=name,
                    duration_seconds=self.duration,
                    now=now,
                    labels={AGENT_LEASE_LABEL: "true"},
                )
            with self.lock:
                self.records[name], self.last[name] = record, now
                self.renewed_at[name] = time.monotonic()

        list(self.pool.map(create, names))
        with self.lock:
            for i, name in enumerate(names):  # spread the renewals over the interval
                heapq.heappush(self.due, (start + self.every * (i / max(len(names), 1)), name))

    def renew(self, name: str) -> None:
        """One renewal: a merge-patch of the Lease's renewTime (an agent PUTs the
        whole Lease; the API server's work is the same, this process's is less, so
        one process keeps up with thousands of agents)."""
        with self.lock:
            if name in self.paused:
                return
        now = datetime.now(UTC)
        sent = time.monotonic()
        try:
            self.patcher.patch(
                "apis", "coordination.k8s.io", "v1", "namespaces", self.namespace, "leases", name,
                body={"spec": {"renewTime": rfc3339(now)}},
            )  # fmt: skip
        except Exception:  # an API server away: the next renewal tries again
            return
        with self.lock:  # paused while in flight: its renewal still counts
            self.last[name] = now
            self.renewals += 1
            gap = sent - self.renewed_at.get(name, sent)
            self.longest_gap[name] = max(self.longest_gap.get(name, 0.0), gap)
            self.renewed_at[name] = sent

    def lapsed(self, longer_than: float) -> dict[str, float]:
        """Nodes that went more than ``longer_than`` seconds without a successful
        renewal at some point (counting the time since their last one)."""
        now = time.monotonic()
        with self.lock:
            gaps = {
                n: max(self.longest_gap.get(n, 0.0), now - at)
                for n, at in self.renewed_at.items()
                if n not in self.paused
            }
        return {n: round(g, 1) for n, g in gaps.items() if g > longer_than}

    def loop(self, stop: threading.Event) -> None:
        while not stop.wait(0.05):
            now = time.monotonic()
            ready = []
            with self.lock:
                while self.due and self.due[0][0] <= now:
                    _, n = heapq.heappop(self.due)
                    if n in self.paused:
                        self.held.add(n)
                    else:
                        ready.append(n)
                        heapq.heappush(self.due, (now + self.every, n))
            for n in ready:
                self.pool.submit(self.renew, n)

    def resume(self, names: list[str]) -> None:
        now = time.monotonic()
        with self.lock:
            self.paused.difference_update(names)
            for n in self.held.intersection(names):  # due while paused: renew now
                heapq.heappush(self.due, (now, n))
            self.held.difference_update(names)

    def pause(self, names: list[str]) -> dict[str, str]:
        with self.lock:
            self.paused.update(names)
        # A renewal already in flight lands before the answer: wait for the pool.
        self.pool.submit(lambda: None).result()
        time.sleep(0.2)
        with self.lock:
            return {n: self.last[n].isoformat() for n in names}


def run_agents(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--every", type=float, required=True)
    parser.add_argument("--duration", type=int, required=True)
    parser.add_argument("--nodes", required=True, help="a file with one node name a line")
    args = parser.parse_args(argv)
    renewer = LeaseRenewer(args.kubeconfig, args.namespace, args.every, args.duration)
    renewer.add(Path(args.nodes).read_text().split())
    stop = threading.Event()
    loop = threading.Thread(target=renewer.loop, args=(stop,), daemon=True)
    loop.start()
    print(json.dumps({"ready": len(renewer.records)}), flush=True)
    for line in sys.stdin:
        verb, *names = line.split()
        if verb == "pause":
            print(json.dumps({"paused": renewer.pause(names)}), flush=True)
        elif verb == "resume":
            renewer.resume(names)
            print(json.dumps({"resumed": len(names)}), flush=True)
        elif verb == "add":
            renewer.add(names)
            print(json.dumps({"added": len(names)}), flush=True)
        elif verb == "lapsed":  # lapsed SECONDS: nodes whose renewals lapsed that long
            print(json.dumps({"lapsed": renewer.lapsed(float(names[0]))}), flush=True)
        elif verb == "count":
            print(json.dumps({"renewals": renewer.renewals}), flush=True)
        elif verb == "last":
            with renewer.lock:
                last = {n: renewer.last[n].isoformat() for n in names}
            print(json.dumps({"last": last}), flush=True)
    # The loop stops submitting before the pool is shut: a renewal submitted while
    # the interpreter exits raised "cannot schedule new futures after interpreter
    # shutdown" at the end of a long run.
    stop.set()
    loop.join(10)
    renewer.pool.shutdown(wait=True, cancel_futures=True)
    return 0


def spawn(mode: str, *args: str) -> subprocess.Popen[str]:
    """This module run as a process of its own in ``mode``, talking over its stdin/stdout."""
    return subprocess.Popen(
        [sys.executable, "-m", "bench.scalefleet", mode, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    )


class Agents:
    """The ``agents`` process, driven from the bench."""

    def __init__(self, kubeconfig: str, namespace: str, nodes: list[str], work: Path,
                 every: float, duration: int) -> None:  # fmt: skip
        listing = work / "agent-nodes.txt"
        listing.write_text("\n".join(nodes))
        self.proc = spawn("agents", "--kubeconfig", kubeconfig, "--namespace", namespace,
                          "--every", str(every), "--duration", str(duration),
                          "--nodes", str(listing))  # fmt: skip
        self.answer()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the agents process ended ({self.proc.poll()})")
        return dict(json.loads(line))

    def command(self, verb: str, names: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
        assert self.proc.stdin is not None
        self.proc.stdin.write(" ".join([verb, *names]) + "\n")
        self.proc.stdin.flush()
        return self.answer()

    def pause(self, names: list[str]) -> dict[str, datetime]:
        return {
            n: datetime.fromisoformat(t) for n, t in self.command("pause", names)["paused"].items()
        }

    def last(self, names: list[str]) -> dict[str, datetime]:
        """Each node's last renewal, without pausing it."""
        return {
            n: datetime.fromisoformat(t) for n, t in self.command("last", names)["last"].items()
        }

    def lapsed(self, longer_than: float) -> dict[str, float]:
        """Nodes whose renewals lapsed more than ``longer_than`` seconds, with their
        longest gap: they were not live for that while, whatever the operator did."""
        return {
            n: float(g) for n, g in self.command("lapsed", [str(longer_than)])["lapsed"].items()
        }

    def renewed_after(self, names: list[str], moment: datetime, timeout: float) -> None:
        """Wait until every one of ``names`` has renewed after ``moment``."""
        deadline = time.monotonic() + timeout
        while True:
            behind = [n for n, t in self.last(names).items() if t <= moment]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(behind)} of {len(names)} nodes (first {behind[0]}) "
                                   f"did not renew after {moment.isoformat()} in {timeout:g}s")  # fmt: skip
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- creating the fleet ---------------------------------------------------------------


def _objects(kubeconfig: str) -> Any:
    return client.CustomObjectsApi(
        load_api_client(kubeconfig, pool_size=16, request_timeout=(30.0, 120.0))
    )


def create_nodes(kubeconfig: str, names: list[str]) -> None:
    objs = _objects(kubeconfig)

    def one(name: str) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SandboxNode",
            "metadata": {"name": name},
        }
        objs.create_cluster_custom_object(
            GROUP, VERSION, "sandboxnodes", body, _preload_content=False
        )

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, names))


def _create_chunk(job: tuple[str, str, list[tuple[str, str]]]) -> int:
    kubeconfig, namespace, items = job
    objs = _objects(kubeconfig)

    def one(item: tuple[str, str]) -> None:
        # A loaded API server times some requests out: try again (a create that
        # landed before its answer was lost is a 409 the second time).
        for attempt in range(6):
            try:
                return create_one(item)
            except ApiException as e:
                if e.status == 409 and attempt:
                    return create_one(item, status_only=True)
                if attempt == 5:
                    raise
            except Exception:
                if attempt == 5:
                    raise
            time.sleep(0.5 * (attempt + 1))

    def create_one(item: tuple[str, str], status_only: bool = False) -> None:
        name, node = item
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Sandbox",
            "metadata": {"name": name},
            "spec": {"image": IMAGE, "nodeName": node},
        }
        if not status_only:
            objs.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "sandboxes", body, _preload_content=False
            )
        objs.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "sandboxes",
            name,
            {"status": {"phase": "Running", "ip": "10.0.0.1"}},
            _preload_content=False,
        )

    with ThreadPoolExecutor(12) as pool:
        list(pool.map(one, items))
    return len(items)


def create_sandboxes(
    kubeconfig: str, namespace: str, placed: list[tuple[str, str]], processes: int = 3
) -> float:
    """Create every (name, node) Sandbox Running; returns the seconds it took."""
    started = time.monotonic()
    chunk = 500
    jobs = [(kubeconfig, namespace, placed[i : i + chunk]) for i in range(0, len(placed), chunk)]
    with get_context("spawn").Pool(processes) as pool:
        for _ in pool.imap_unordered(_create_chunk, jobs):
            pass
    return time.monotonic() - started


# -- loading the fleet into etcd -------------------------------------------------------

ETCD_PREFIX = "/registry"  # the API server's default --etcd-prefix
TXN_OPS = 128  # etcd's default --max-txn-ops


def _stamped(value: Any, swaps: dict[str, str]) -> Any:
    """``value`` with every string equal to a key of ``swaps`` replaced by its value."""
    if isinstance(value, dict):
        return {k: _stamped(v, swaps) for k, v in value.items()}
    if isinstance(value, list):
        return [_stamped(v, swaps) for v in value]
    if isinstance(value, str):
        return swaps.get(value, value)
    return value


def stamp(template: dict[str, Any], name: str, node: str) -> dict[str, Any]:
    """A copy of a stored Sandbox for ``name`` on ``node``: every string that was the
    template's name or node is the copy's, and it has a uid of its own."""
    meta = template["metadata"]
    swaps = {meta["name"]: name, template["spec"]["nodeName"]: node, meta["uid"]: str(uuid.uuid4())}
    return dict(_stamped(template, swaps))


class Etcd:
    """etcd's JSON gateway (``/v3/kv/...``) on the private plane's loopback URL."""

    def __init__(self, url: str) -> None:
        parsed = urlsplit(url)
        if parsed.scheme != "http" or parsed.hostname not in ("127.0.0.1", "localhost"):
            raise ValueError(f"etcd at {url}: only a plain loopback etcd is loaded directly")
        self.host, self.port = parsed.hostname, parsed.port or 2379
        self.local = threading.local()

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"etcd {path}: {resp.status} {data[:300]!r}")
        return dict(json.loads(data))

    def get(self, key: str) -> bytes | None:
        kvs = self.call("/v3/kv/range", {"key": _b64(key.encode())}).get("kvs") or []
        return base64.b64decode(kvs[0]["value"]) if kvs else None

    def create_all(self, items: list[tuple[str, bytes]]) -> None:
        """Put every (key, value) in one transaction, only if no key exists yet."""
        keys = [_b64(k.encode()) for k, _ in items]
        body = {
            "compare": [
                {"key": k, "target": "CREATE", "result": "EQUAL", "create_revision": "0"}
                for k in keys
            ],
            "success": [
                {"request_put": {"key": k, "value": _b64(v)}}
                for k, (_, v) in zip(keys, items, strict=True)
            ],
        }
        answer = self.call("/v3/kv/txn", body)
        if not answer.get("succeeded"):
            raise RuntimeError(
                f"etcd refused {len(items)} creations: one of {items[0][0]}.. exists"
            )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def load_sandboxes(
    plane: Any, namespace: str, placed: list[tuple[str, str]], threads: int = 4
) -> float:
    """Every (name, node) Sandbox Running, as the API server stores it; returns the
    seconds it took, until the API server lists them all.

    The API server creates the first one (create, then its status): its stored bytes
    are the template. Every other is that object with its own name, uid and node,
    written straight into etcd, ``TXN_OPS`` creations a transaction. The API server's
    watch of etcd then serves them like any it wrote (the operator lists and watches
    them through it); creating 150,000 through the API server costs 300,000 requests,
    hours on 2 cores beside everything else."""
    started = time.monotonic()
    (first, first_node), rest = placed[0], placed[1:]
    _create_chunk((str(plane.kubeconfig), namespace, [(first, first_node)]))
    etcd = Etcd(plane.etcd_url)
    prefix = f"{ETCD_PREFIX}/{GROUP}/sandboxes/{namespace}/"
    stored = etcd.get(prefix + first)
    if stored is None or not stored.startswith(b"{"):
        raise RuntimeError(
            f"sandbox {first} is not stored as JSON under {prefix} (got {stored[:40]!r}): "
            "the loader cannot copy it"
            if stored
            else f"sandbox {first} not found under {prefix}"
        )
    template = json.loads(stored)
    if (template.get("status") or {}).get("phase") != "Running":
        raise RuntimeError(f"the template sandbox {first} is stored without its Running status")
    template["metadata"].pop("resourceVersion", None)

    def batch(chunk: list[tuple[str, str]]) -> None:
        etcd.create_all([
            (prefix + name, json.dumps(stamp(template, name, node), separators=(",", ":")).encode())
            for name, node in chunk
        ])  # fmt: skip

    chunks = [rest[i : i + TXN_OPS] for i in range(0, len(rest), TXN_OPS)]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(batch, chunks))
    listed = _count_listed(plane, namespace, len(placed), timeout=600)
    if listed != len(placed):
        raise RuntimeError(f"the API server lists {listed} sandboxes, {len(placed)} were loaded")
    return time.monotonic() - started


def _count_listed(plane: Any, namespace: str, want: int, timeout: float) -> int:
    """How many Sandboxes the API server lists, once that is ``want`` or the timeout
    has passed (its watch of etcd catches up with the load)."""
    objs = _objects(str(plane.kubeconfig))
    deadline = time.monotonic() + timeout
    while True:
        count, token = 0, None
        while True:
            try:
                page = objs.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, "sandboxes", limit=5000, _continue=token,
                    _preload_content=False,
                )  # fmt: skip
            except ApiException as e:
                # 504 "Too large resource version": the API server's cache of etcd is
                # still behind the load; 410: the listing outlived its snapshot.
                if e.status not in (410, 504) or time.monotonic() > deadline:
                    raise
                time.sleep(1)
                count, token = 0, None
                continue
            body = json.loads(page.data)
            count += sum(
                1 for o in body["items"] if (o.get("status") or {}).get("phase") == "Running"
            )
            token = body["metadata"].get("continue")
            if not token:
                break
        if count == want or time.monotonic() > deadline:
            return count
        time.sleep(1)


def _bare_patches(job: tuple[str, str, list[str], int, str]) -> tuple[float, float, float]:
    kubeconfig, namespace, names, concurrency, message = job
    objs = _objects(kubeconfig)

    def patch(name: str) -> None:
        # The fields a mark writes (phase, reason, message, finishedAt, the Ready
        # condition), so the API server does for each patch what it does for a mark.
        body = {"status": dead_status(SandboxReason.NODE_LOST, message, datetime.now(UTC))}
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, "sandboxes", name, body
        )

    def read(name: str) -> None:
        objs.get_namespaced_custom_object(GROUP, VERSION, namespace, "sandboxes", name)

    with ThreadPoolExecutor(concurrency) as pool:
        # Its connections opened first: the operator's are warm too.
        list(pool.map(read, names[:concurrency]))
        cpu, began = time.process_time(), time.time()
        list(pool.map(patch, names))
        return began, time.time(), time.process_time() - cpu


def _bare_marking(job: tuple[str, str, int, int, str]) -> tuple[float, float, float]:
    kubeconfig, node, concurrency, first_page, message = job
    objs = _objects(kubeconfig)
    selector = f"spec.nodeName={node}"

    def patch(item: dict[str, Any]) -> None:
        # What a mark sends: the fields merged into the sandbox's conditions as read,
        # under the resourceVersion read.
        meta = item["metadata"]
        body = {
            "metadata": {"resourceVersion": meta["resourceVersion"]},
            "status": dead_status(SandboxReason.NODE_LOST, message, datetime.now(UTC), item),
        }
        objs.patch_namespaced_custom_object_status(
            GROUP, VERSION, meta["namespace"], "sandboxes", meta["name"], body
        )

    def read(item: dict[str, Any]) -> None:
        meta = item["metadata"]
        objs.get_namespaced_custom_object(
            GROUP, VERSION, meta["namespace"], "sandboxes", meta["name"]
        )

    def listing(limit: int | None = None) -> list[dict[str, Any]]:
        extra = {"limit": limit} if limit else {}
        out = objs.list_cluster_custom_object(
            GROUP, VERSION, "sandboxes", field_selector=selector, **extra
        )
        return list(out["items"])

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(read, listing(concurrency)))  # its connections warm, as the operator's
        cpu, began = time.process_time(), time.time()
        # The marking pass's requests: the node's first page, its writes under way
        # while the node is listed whole, then the writes the page did not hold.
        page = listing(first_page)
        writes = [pool.submit(patch, item) for item in page]
        held = {(i["metadata"]["namespace"], i["metadata"]["name"]) for i in page}
        for item in listing():
            if (item["metadata"]["namespace"], item["metadata"]["name"]) not in held:
                writes.append(pool.submit(patch, item))
        for write in writes:
            write.result()
        return began, time.time(), time.process_time() - cpu


def bare_marking(
    kubeconfig: str,
    node: str,
    concurrency: int,
    first_page: int,
    message: str = "bare marking",
) -> BarePatches:
    """A bare client making a marking pass's requests for ``node``: its first page of
    ``first_page`` sandboxes by ``spec.nodeName``, their writes under way while it
    lists the node whole, then the rest; each write what a mark writes, under the
    resourceVersion listed. When, and its CPU."""
    with get_context("spawn").Pool(1) as pool:
        began, ended, cpu = pool.apply(
            _bare_marking, ((kubeconfig, node, concurrency, first_page, message),)
        )
    return BarePatches(float(began), float(ended), float(cpu))


@dataclass(frozen=True)
class BarePatches:
    began: float  # epoch seconds
    ended: float
    cpu: float  # the bare client's own CPU seconds over its patches

    @property
    def seconds(self) -> float:
        return self.ended - self.began


def bare_patches(
    kubeconfig: str,
    namespace: str,
    names: list[str],
    concurrency: int,
    message: str = "bare patch",
) -> BarePatches:
    """A bare client (a process of its own, ``concurrency`` threads, nothing else to
    do) patches the status of ``names`` as a Dead mark with ``message`` would: when,
    and its CPU. Each patch must change the object (a patch that changes nothing is
    not written to etcd), so a second pass over the same sandboxes needs another
    message."""
    with get_context("spawn").Pool(1) as pool:
        began, ended, cpu = pool.apply(
            _bare_patches, ((kubeconfig, namespace, names, concurrency, message),)
        )
    return BarePatches(float(began), float(ended), float(cpu))


# -- reading back ---------------------------------------------------------------------

OPERATOR_USER = "scale-operator"
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  users: [{OPERATOR_USER}]
- level: None
"""


def operator_identity(workdir: Path, server_ca: tuple[str, str] | None = None) -> list[str]:
    """Before the control plane starts: a token of the operator's own (so the API
    server's audit log tells its requests apart, whatever library sent them) and an
    audit policy that logs that user's requests alone. Returns the API server flags."""
    workdir.mkdir(parents=True, exist_ok=True)
    admin, operator = os.urandom(24).hex(), os.urandom(24).hex()
    (workdir / "tokens.csv").write_text(
        f'{admin},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
        f'{operator},{OPERATOR_USER},{OPERATOR_USER},"system:masters"\n'
    )
    (workdir / "tokens.csv").chmod(0o600)
    (workdir / "operator.token").write_text(operator)
    (workdir / "audit-policy.yaml").write_text(AUDIT_POLICY)
    return [
        f"--audit-policy-file={workdir / 'audit-policy.yaml'}",
        f"--audit-log-path={workdir / 'audit.log'}",
        "--audit-log-format=json",
        "--audit-log-mode=batch",
        "--audit-log-batch-max-wait=1s",
    ]


def operator_kubeconfig(plane: Any, target: Path) -> Path:
    token = (plane.workdir / "operator.token").read_text()
    target.write_text(
        yaml.safe_dump(kubeconfig_dict(plane.url, str(plane.ca_file), OPERATOR_USER, token=token))
    )
    return target


class OperatorRequests:
    """The operator's requests as the API server's audit log saw them, by verb and
    resource (watches are one record each, at their end: left out)."""

    def __init__(self, log: Path) -> None:
        self.log = log

    def read(self, since: float, until: float) -> Counter[tuple[str, str]]:
        counts: Counter[tuple[str, str]] = Counter()
        if not self.log.exists():
            return counts
        for line in self.log.read_text().splitlines():
            event = json.loads(line)
            if event.get("verb") == "watch":
                continue
            t = datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if not since <= t.timestamp() < until:
                continue
            ref = event.get("objectRef") or {}
            resource = ref.get("resource") or event.get("requestURI", "-").split("?")[0]
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            counts[(event["verb"], resource)] += 1
        return counts


class DeadWatch:
    """Watches Sandboxes from now on; records when each is first seen Dead."""

    timeout = 3600  # seconds each watch request asks the API server for

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.objs: Any = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.dead: dict[str, float] = {}
        self.lock = threading.Lock()
        self._watch = watch.Watch()
        self.rewatches = self.relists = 0
        listed: Any = self.objs.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "sandboxes", limit=1
        )
        rv = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, args=(rv,), daemon=True)
        self._thread.start()

    def _run(self, rv: str) -> None:
        """Watch until stopped. A watch the API server ends (its timeout, or a watcher
        it judged too slow to keep up and closed) is resumed from the last version
        seen; one whose version is too old is listed again, and every Sandbox found
        Dead in that listing is recorded at the listing (counted in ``relists``)."""
        while not self._watch._stop:
            try:
                for event in self._watch.stream(
                    self.objs.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self.namespace,
                    "sandboxes",
                    resource_version=rv,
                    timeout_seconds=self.timeout,
                ):
                    obj = event["object"]
                    if event["type"] == "ERROR":
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    rv = obj["metadata"]["resourceVersion"]
                    self._record(obj)
            except Exception as e:  # the control plane stopped, or the watch expired
                if self._watch._stop:
                    return
                if getattr(e, "status", None) == 410 or "410" in str(e):
                    rv = self._relist()
                else:
                    time.sleep(0.2)
            self.rewatches += 1

    def _record(self, obj: dict[str, Any]) -> None:
        if (obj.get("status") or {}).get("phase") == "Dead":
            with self.lock:
                self.dead.setdefault(obj["metadata"]["name"], time.time())

    def _relist(self) -> str:
        self.relists += 1
        listing = self.objs.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                          "sandboxes")  # fmt: skip
        for obj in listing["items"]:
            self._record(obj)
        return str(listing["metadata"]["resourceVersion"])

    def wait(self, names: list[str], timeout: float) -> dict[str, float]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                seen = {n: self.dead[n] for n in names if n in self.dead}
            if len(seen) == len(names):
                return seen
            time.sleep(0.05)
        raise TimeoutError(
            f"{len(names) - len(seen)} of {len(names)} sandboxes not seen Dead within "
            f"{timeout:.0f}s"
        )

    def stop(self) -> None:
        self._watch.stop()


def run_lease_reader(argv: list[str]) -> int:
    """The floor of reading the agents' renewals: the same watch the operator's Lease
    informer makes (same client library, JSON dicts, same label selector), each
    event's name and renewTime read, nothing else. Counts events until stdin closes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    args = parser.parse_args(argv)
    api = load_api_client(args.kubeconfig)
    leases: Any = client.CoordinationV1Api(api)
    selector = f"{AGENT_LEASE_LABEL}=true"
    seen = {"events": 0}
    stop = threading.Event()

    def read() -> None:
        version = leases.list_namespaced_lease(
            args.namespace, label_selector=selector
        ).metadata.resource_version
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a watch that ends is resumed
                for event in watch.Watch().stream(
                    leases.list_namespaced_lease,
                    args.namespace,
                    label_selector=selector,
                    resource_version=version,
                    timeout_seconds=60,
                    deserialize=False,
                ):
                    obj = event["object"]
                    meta = obj["metadata"]
                    _ = (meta["name"], obj["spec"].get("renewTime"))
                    version = meta["resourceVersion"]
                    seen["events"] += 1

    threading.Thread(target=read, daemon=True).start()
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.read()  # until the bench closes it
    stop.set()
    print(json.dumps(seen), flush=True)
    return 0


class LeaseReader:
    """The ``leasereader`` process: its CPU over a window is the floor of the
    operator's CPU for reading the same renewals."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        self.proc = spawn("leasereader", "--kubeconfig", kubeconfig, "--namespace", namespace)
        assert self.proc.stdout is not None
        if not self.proc.stdout.readline():
            raise RuntimeError(f"the lease reader ended ({self.proc.poll()})")

    def stop(self) -> int:
        """Stop it; the number of events it read."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            line = self.proc.stdout.readline()
            self.proc.wait(10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return int(json.loads(line)["events"]) if line else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["agents"]:
        sys.exit(run_agents(sys.argv[2:]))
    if sys.argv[1:2] == ["leasereader"]:
        sys.exit(run_lease_reader(sys.argv[2:]))
    sys.exit(f"usage: {sys.argv[0]} agents|leasereader --kubeconfig K --namespace NS ...")
