"""How long the API server takes to list one node's sandboxes among M, by the ways
the operator could ask.

    .venv/bin/python bench/node_listing.py [--sandboxes 150000] [--nodes 5000]

A private control plane, M Running sandboxes over N nodes loaded straight into etcd
(``scalefleet.load_sandboxes``), nothing else running on it. Ten nodes' sandboxes
are listed by the ``spec.nodeName`` field selector: the whole list in one request
(the API server's watch cache, a consistent read), in pages of 32 (the marker's
first page at the default 16 writes in flight) and of 500, from the cache at any
version (``resourceVersion=0``), and, for a node larger than its first page, in
pages of 16 continued by their token against a page of 16 and then the node whole
(the marker's way). Each listing is checked to hold the node's M/N sandboxes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes import client
from tests.support.kube import start_private_plane

from bench.scalefleet import load_sandboxes
from sandlot.adapters.kube import load_api_client
from sandlot.api import GROUP, VERSION

NS = "scale"
SAMPLES = 10  # nodes listed per way
REQUEST_TIMEOUT = 300  # seconds: a continuation read from etcd took more than 90 at 150,000
WAYS: list[tuple[str, dict[str, Any]]] = [
    ("whole, one request", {}),
    ("pages of 32", {"limit": 32}),
    ("pages of 500", {"limit": 500}),
    ("whole, resourceVersion=0", {"resource_version": "0"}),
    # A node larger than its first page: the rest by the page's continue token (the
    # marker before), or the node whole in a second request (the marker now).
    ("pages of 16, continued", {"limit": 16}),
    # The same while the sandboxes change, as they do while a node's marks go out:
    # one status write to another node's sandbox between the page and the rest.
    ("pages of 16, a write, continued", {"limit": 16, "write_between": True}),
    (
        "a page of 16, a write, then whole",
        {"limit": 16, "then_whole": True, "write_between": True},
    ),
    ("whole, one request (again)", {}),
]


def list_node(
    objs: Any, node: str, then_whole: bool = False, write_between: bool = False, **kwargs: Any
) -> int:
    if then_whole:  # the marker's way: a first page, and the node whole if it had more
        first = _listing(objs, node, **kwargs)
        if not first["metadata"].get("continue"):
            return len(first["items"])
        if write_between:
            _write_elsewhere(objs)
        rest = _listing(objs, node)
        names = {i["metadata"]["name"] for i in first["items"] + rest["items"]}
        return len(names)
    token, count = None, 0
    for _ in range(10_000):  # bounded: far more pages than any node has
        extra: dict[str, str] = {"_continue": token} if token else {}
        body = _listing(objs, node, **kwargs, **extra)
        count += len(body["items"])
        token = body["metadata"].get("continue")
        if not token:
            return count
        if write_between:
            _write_elsewhere(objs)
    raise RuntimeError(f"node {node}: still paging after 10,000 pages")


WRITTEN = "s-n00000-0"  # a sandbox of a node never listed here
_writes = iter(range(10**9))


def _write_elsewhere(objs: Any) -> None:
    objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, "sandboxes", WRITTEN,
        {"status": {"message": f"write {next(_writes)}"}}, _request_timeout=REQUEST_TIMEOUT,
    )  # fmt: skip


def _listing(objs: Any, node: str, **kwargs: Any) -> dict[str, Any]:
    response = objs.list_cluster_custom_object(
        GROUP, VERSION, "sandboxes", field_selector=f"spec.nodeName={node}",
        _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs,
    )  # fmt: skip
    body: dict[str, Any] = json.loads(response.data)
    return body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sandboxes", type=int, default=150_000)
    parser.add_argument("--nodes", type=int, default=5_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sl-listing-"))
    plane = start_private_plane(work / "cp", namespaces=(NS,))
    try:
        nodes = [f"n{i:05d}" for i in range(args.nodes)]
        per = args.sandboxes // args.nodes
        placed = [(f"s-{n}-{i}", n) for n in nodes for i in range(per)]
        took = load_sandboxes(plane, NS, placed)
        print(f"{len(placed)} sandboxes over {args.nodes} nodes loaded in {took:.1f}s")
        api = load_api_client(str(plane.kubeconfig), pool_size=4)
        objs = client.CustomObjectsApi(api)
        sample = nodes[len(nodes) // 2 :][:SAMPLES]
        for label, kwargs in WAYS:
            times = []
            for node in sample:
                started = time.perf_counter()
                count = list_node(objs, node, **kwargs)
                times.append(time.perf_counter() - started)
                if count != per:
                    raise AssertionError(f"{label}: node {node} listed {count}, holds {per}")
            print(f"  {label:28s} median {statistics.median(times) * 1e3:7.1f} ms "
                  f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}) "
                  f"for {per} sandboxes among {len(placed)}")  # fmt: skip
        api.close()
    finally:
        plane.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
