"""An in-memory stand-in for the operator's API boundary, for controller unit tests.

It implements the part of ``sandlot.adapters.objects.Objects`` and
``sandlot.adapters.workloads.WorkloadApi`` the controllers call, with the API
server's answers the controllers rely on: a resourceVersion per write (opaque
strings), 409 on a stale precondition, 404 when gone, JSON merge patches of
status. What it claims is only what those adapters promise; the API server's
own semantics are tested against the real one in ``tests/integration``.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandlot.adapters.workloads import BindResult
from sandlot.api.common import API_VERSION
from sandlot.api.timestamps import rfc3339


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386: nulls remove, objects merge, everything else replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class FakeObjects:
    def __init__(self, clock: Callable[[], datetime]) -> None:
        self.now = clock
        self.nodes: dict[str, dict[str, Any]] = {}
        self.sandboxes: dict[str, dict[str, Any]] = {}  # "ns/name" -> body
        self.pools: dict[str, dict[str, Any]] = {}
        self.claims: dict[str, dict[str, Any]] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}  # "ns/name" -> body
        self.writes: list[tuple[str, str]] = []  # (verb, key), in order
        self.failing: dict[str, int] = {}  # "ns/name" -> HTTP status its writes fail with
        # verb ("get" or a write's, as in ``writes``) -> what its next calls raise, in order
        self.faults: dict[str, list[Exception]] = {}
        self.status_versions: list[str | None] = []  # resourceVersion each status patch sent
        self.before_write: Callable[[str, str], None] | None = None
        self.on_list: Callable[[str], None] | None = None  # each listing, each page
        # (node, limit, items) a listing of a node's sandboxes; limit None for a whole one
        self.pages: list[tuple[str, int | None, int]] = []
        self.continued: list[str] = []  # nodes listed with a continue token
        self._rv = itertools.count(100)
        self._uid = itertools.count(1)
        self._names = itertools.count(1)
        self._lock = threading.Lock()  # the Marker writes from a thread pool

    # -- building the world -----------------------------------------------------------

    def _next_rv(self) -> str:
        return str(next(self._rv))

    def add_node(self, name: str, created: datetime, **spec: Any) -> dict[str, Any]:
        body = {
            "apiVersion": API_VERSION,
            "kind": "SandboxNode",
            "metadata": {
                "name": name,
                "uid": f"uid-{next(self._uid)}",
                "resourceVersion": self._next_rv(),
                "creationTimestamp": rfc3339(created),
            },
            "spec": dict(spec),
            "status": {},
        }
        self.nodes[name] = body
        return copy.deepcopy(body)

    def add_sandbox(
        self,
        namespace: str,
        name: str,
        created: datetime,
        *,
        node: str | None = None,
        phase: str = "Pending",
        labels: Mapping[str, str] | None = None,
        owner_uid: str | None = None,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{next(self._uid)}",
            "resourceVersion": self._next_rv(),
            "creationTimestamp": rfc3339(created),
            "labels": dict(labels or {}),
        }
        if owner_uid is not None:
            meta["ownerReferences"] = [{"uid": owner_uid, "controller": True}]
        body = {
            "apiVersion": API_VERSION,
            "kind": "Sandbox",
            "metadata": meta,
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase},
        }
        self.sandboxes[f"{namespace}/{name}"] = body
        return copy.deepcopy(body)

    def touch(self, body: dict[str, Any]) -> None:
        """A change made behind the controllers' back gets a new resourceVersion."""
        body["metadata"]["resourceVersion"] = self._next_rv()

    def fail_next(self, verb: str, *answers: Exception) -> None:
        """The next calls of ``verb`` raise ``answers`` in turn, before looking at
        anything (an API error, or a transport error for no answer at all)."""
        self.faults.setdefault(verb, []).extend(answers)

    def _fault(self, verb: str) -> None:
        pending = self.faults.get(verb)
        if pending:
            raise pending.pop(0)

    def phase(self, key: str) -> str | None:
        body = self.sandboxes.get(key)
        return None if body is None else body["status"].get("phase")

    def _write(self, verb: str, key: str) -> None:
        if self.before_write is not None:
            self.before_write(verb, key)
        self._fault(verb)
        status = self.failing.get(key)
        if status is not None:
            raise ApiException(status=status, reason="injected failure")
        self.writes.append((verb, key))

    def _sandbox(self, namespace: str, name: str) -> dict[str, Any]:
        body = self.sandboxes.get(f"{namespace}/{name}")
        if body is None:
            raise ApiException(status=404, reason="Not Found")
        return body

    # -- Objects -------------------------------------------------------------------

    def list_node_sandboxes(self, node: str) -> list[dict[str, Any]]:
        if self.on_list is not None:
            self.on_list(node)
        with self._lock:
            whole = [
                copy.deepcopy(b)
                for b in self.sandboxes.values()
                if b["spec"].get("nodeName") == node
            ]
            self.pages.append((node, None, len(whole)))
            return whole

    def node_sandboxes_page(
        self, node: str, limit: int, token: str | None = None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """Pages in name order; the token is the last name of the page before."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if self.on_list is not None:
            self.on_list(node)
        with self._lock:
            if token is not None:
                self.continued.append(node)
            keys = sorted(
                k
                for k, b in self.sandboxes.items()
                if b["spec"].get("nodeName") == node and (token is None or k > token)
            )
            page = keys[:limit]
            self.pages.append((node, limit, len(page)))
            more = page[-1] if len(keys) > limit else None
            return [copy.deepcopy(self.sandboxes[k]) for k in page], more

    def list_all(self, plural: str) -> list[dict[str, Any]]:
        """Every Sandbox or SandboxSnapshot (``plural``), in every namespace."""
        with self._lock:
            self._fault("list")
            held = {"sandboxes": self.sandboxes, "sandboxsnapshots": self.snapshots}[plural]
            return [copy.deepcopy(b) for b in held.values()]

    def get_snapshot(self, namespace: str, name: str) -> dict[str, Any] | None:
        body = self.snapshots.get(f"{namespace}/{name}")
        return copy.deepcopy(body) if body is not None else None

    def find_sandbox(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            self._fault("get")
            found = self.sandboxes.get(f"{namespace}/{name}")
            return copy.deepcopy(found) if found is not None else None

    def get_sandbox(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            self._fault("get")
            return copy.deepcopy(self._sandbox(namespace, name))

    def patch_sandbox_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        with self._lock:
            self.status_versions.append(resource_version)
            self._write("patch-status", f"{namespace}/{name}")
            body = self._sandbox(namespace, name)
            if resource_version is not None and body["metadata"]["resourceVersion"] != str(
                resource_version
            ):
                raise ApiException(status=409, reason="Conflict")
            body["status"] = merge_patch(body["status"], status)
            body["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(body)

    def patch_node_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        with self._lock:
            self._write("patch-node-status", name)
            body = self.nodes[name]
            body["status"] = merge_patch(body["status"], status)
            body["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(body)

    def _node_as_of(self, verb: str, name: str, resource_version: str) -> dict[str, Any] | None:
        """Node ``name`` for a write made as of ``resource_version``; None (as a 409 or
        a 404 would say) when it changed since or is gone."""
        self._write(verb, name)
        body = self.nodes.get(name)
        if body is None or body["metadata"]["resourceVersion"] != resource_version:
            return None
        return body

    def patch_node_status_as_of(
        self, name: str, status: Mapping[str, Any], resource_version: str
    ) -> str | None:
        with self._lock:
            body = self._node_as_of("patch-node-status", name, resource_version)
            if body is None:
                return None
            body["status"] = merge_patch(body["status"], status)
            body["metadata"]["resourceVersion"] = self._next_rv()
            return str(body["metadata"]["resourceVersion"])

    def patch_node_labels(
        self, name: str, labels: Mapping[str, str | None], resource_version: str
    ) -> bool:
        with self._lock:
            body = self._node_as_of("patch-node-labels", name, resource_version)
            if body is None:
                return False
            meta = body["metadata"]
            meta["labels"] = merge_patch(meta.get("labels") or {}, labels)
            meta["resourceVersion"] = self._next_rv()
            return True

    # -- WorkloadApi -------------------------------------------------------------------

    def bind(self, namespace: str, name: str, node: str, resource_version: str) -> BindResult:
        with self._lock:
            self._write("bind", f"{namespace}/{name}")
            body = self.sandboxes.get(f"{namespace}/{name}")
            if body is None:
                return BindResult("gone")
            if body["metadata"]["resourceVersion"] != resource_version:
                outcome = "taken" if body["spec"].get("nodeName") else "conflict"
                return BindResult(outcome, copy.deepcopy(body))  # type: ignore[arg-type]
            body["spec"]["nodeName"] = node
            body["metadata"]["resourceVersion"] = self._next_rv()
            return BindResult("bound", copy.deepcopy(body))

    def write_status(
        self, namespace: str, name: str, status: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any] | None:
        try:
            return self.patch_sandbox_status(namespace, name, status, resource_version)
        except ApiException as e:
            if e.status in (404, 409):
                return None
            raise

    def create_sandbox(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        name = meta.get("name") or f"{meta['generateName']}{next(self._names):05d}"
        with self._lock:
            self._write("create", f"{namespace}/{name}")
        owner = next(iter(meta.get("ownerReferences") or []), None)
        created = self.add_sandbox(
            namespace,
            name,
            self.now(),
            labels=meta.get("labels"),
            owner_uid=owner["uid"] if owner else None,
        )
        self.sandboxes[f"{namespace}/{name}"]["spec"] = dict(body.get("spec") or {})
        created["spec"] = dict(body.get("spec") or {})
        return created

    def delete_sandbox(
        self, namespace: str, name: str, uid: str, resource_version: str | None = None
    ) -> bool:
        with self._lock:
            self._write("delete", f"{namespace}/{name}")
            body = self.sandboxes.get(f"{namespace}/{name}")
            if body is None or body["metadata"]["uid"] != uid:
                return False
            if resource_version is not None and body["metadata"]["resourceVersion"] != str(
                resource_version
            ):
                return False
            del self.sandboxes[f"{namespace}/{name}"]
            return True

    def patch_pool_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        with self._lock:
            self._write("patch-pool-status", f"{namespace}/{name}")
            body = self.pools.get(f"{namespace}/{name}")
            if body is None:
                return None
            body["status"] = merge_patch(body.get("status") or {}, status)
            body["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(body)

    def delete_claim(self, namespace: str, name: str, uid: str) -> bool:
        with self._lock:
            self._write("delete-claim", f"{namespace}/{name}")
            body = self.claims.get(f"{namespace}/{name}")
            if body is None or body["metadata"]["uid"] != uid:
                return False
            del self.claims[f"{namespace}/{name}"]
            return True

    def take_sandbox(
        self, namespace: str, name: str, resource_version: str, metadata: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        with self._lock:
            self._write("take", f"{namespace}/{name}")
            body = self.sandboxes.get(f"{namespace}/{name}")
            if body is None or body["metadata"]["resourceVersion"] != resource_version:
                return None
            body["metadata"] = merge_patch(body["metadata"], metadata)
            body["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(body)

    def patch_claim_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        with self._lock:
            self._write("patch-claim-status", f"{namespace}/{name}")
            body = self.claims.get(f"{namespace}/{name}")
            if body is None:
                return None
            body["status"] = merge_patch(body.get("status") or {}, status)
            body["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(body)
