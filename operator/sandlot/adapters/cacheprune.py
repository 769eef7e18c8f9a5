"""CachePrune requests over the Kubernetes API, for the CLI and the operator.

The CLI creates a request and polls it; the operator resolves its targets and
answers for nodes that cannot. Reads come back as the pydantic models, so
neither caller touches the wire format. The operator's status write carries the
object's resourceVersion: an agent merge-patches its own result into the same
map at any moment, and an error written for a node must never replace a result
that node's agent has just written (a 409 makes the caller re-read and decide
again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import load_api_client
from sandlot.api.cacheprune import CachePrune, CachePruneSpec
from sandlot.api.common import API_VERSION, CACHEPRUNES, GROUP, VERSION
from sandlot.api.keys import AGENT_LEASE_LABEL


class Conflict(Exception):
    """The object changed since it was read (HTTP 409)."""


class CachePruneError(Exception):
    """The API server refused a CachePrune call; the message says what and why."""


def _explain(exc: ApiException, what: str) -> CachePruneError:
    return CachePruneError(f"{what}: {exc.status} {exc.reason}")


class CachePrunes:
    """CachePrune objects through one ApiClient (synchronous)."""

    def __init__(self, api: client.ApiClient, *, owns_client: bool = False) -> None:
        self.api = api
        self.custom: Any = client.CustomObjectsApi(api)
        self._owns_client = owns_client

    @classmethod
    def connect(cls, kubeconfig: str | None = None) -> CachePrunes:
        """From ``kubeconfig`` (or $KUBECONFIG, ~/.kube/config), else the in-cluster config."""
        return cls(load_api_client(kubeconfig), owns_client=True)

    def close(self) -> None:
        if self._owns_client:
            self.api.close()

    def __enter__(self) -> CachePrunes:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def create(
        self, *, all_: bool, nodes: Sequence[str], generate_name: str = "prune-"
    ) -> CachePrune:
        spec = CachePruneSpec(all=all_, nodes=list(nodes))
        body = {
            "apiVersion": API_VERSION,
            "kind": "CachePrune",
            "metadata": {"generateName": generate_name},
            "spec": spec.wire(),
        }
        try:
            created = self.custom.create_cluster_custom_object(GROUP, VERSION, CACHEPRUNES, body)
        except ApiException as exc:
            raise _explain(exc, "cannot create a CachePrune") from exc
        return CachePrune.model_validate(created)

    def get_raw(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.custom.get_cluster_custom_object(GROUP, VERSION, CACHEPRUNES, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _explain(exc, f"cannot read CachePrune {name}") from exc

    def get(self, name: str) -> CachePrune | None:
        raw = self.get_raw(name)
        return None if raw is None else CachePrune.model_validate(raw)

    def patch_status(
        self, name: str, status: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any]:
        """Merge-patch ``status`` through the status subresource, only if unchanged since read.

        Raises ``Conflict`` on 409 (re-read and decide again).
        """
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
        try:
            return dict(
                self.custom.patch_cluster_custom_object_status(
                    GROUP, VERSION, CACHEPRUNES, name, body
                )
            )
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"CachePrune {name} changed since it was read") from exc
            raise _explain(exc, f"cannot write the status of CachePrune {name}") from exc


def agent_lease_expiries(api: client.ApiClient, namespace: str) -> dict[str, datetime | None]:
    """Node name -> ``renewTime + leaseDurationSeconds`` of every agent Lease (one list).

    The value is None for a Lease never renewed.
    """
    coordination: Any = client.CoordinationV1Api(api)
    try:
        leases = coordination.list_namespaced_lease(
            namespace, label_selector=f"{AGENT_LEASE_LABEL}=true"
        )
    except ApiException as exc:
        raise _explain(exc, f"cannot list agent Leases in {namespace}") from exc
    out: dict[str, datetime | None] = {}
    for lease in leases.items:
        spec = lease.spec
        renew = spec.renew_time if spec is not None else None
        duration = int(spec.lease_duration_seconds or 0) if spec is not None else 0
        out[lease.metadata.name] = None if renew is None else renew + timedelta(seconds=duration)
    return out


__all__ = ["CachePruneError", "CachePrunes", "Conflict", "agent_lease_expiries"]
