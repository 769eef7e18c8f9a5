"""Keeps ``sandlot.dev/tainted`` on the SandboxNodes that have a blocking taint.

The placement admission policy (``sandlot.api.placementpolicy``) can only select
its SandboxNodes by label, so the label must follow the taints: the admin's
``spec.taints`` and the agent's mirrored ``status.nodeTaints``. Each node event
asks ``policy.placement.tainted_label`` and applies its answer with the
resourceVersion it was decided on (a 409: a newer event decides again). Only the
leader writes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kopf

from sandlot.adapters.objects import Objects
from sandlot.api.common import GROUP, VERSION
from sandlot.policy.placement import tainted_label

log = logging.getLogger(__name__)


def sync_label(objects: Objects, body: Any) -> bool:
    """Apply the label change ``body`` calls for; True if written."""
    change = tainted_label(body)
    if change is None:
        return False
    meta = body["metadata"]
    if not objects.patch_node_labels(meta["name"], change, str(meta["resourceVersion"])):
        return False
    log.info("SandboxNode %s: label %s", meta["name"], change)
    return True


def register(
    registry: kopf.OperatorRegistry,
    objects: Objects,
    leading: Callable[[], bool],
    resync_seconds: float,
) -> None:
    # Plain functions: kopf runs them in a thread, so their request blocks no handler.
    @kopf.on.event(GROUP, VERSION, "sandboxnodes", registry=registry)
    def node_taints(body: kopf.Body, **kwargs: Any) -> None:
        if kwargs.get("type") == "DELETED" or not leading():
            return
        sync_label(objects, body)

    # A new leader missed the events of its predecessor's term: the resync catches up.
    @kopf.timer(GROUP, VERSION, "sandboxnodes", interval=resync_seconds, registry=registry)
    def node_taints_resync(body: kopf.Body, **_: Any) -> None:
        if leading():
            sync_label(objects, body)


__all__ = ["register", "sync_label"]
