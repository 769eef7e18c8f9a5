"""Keeps ``sandlot.dev/tainted`` on the SandboxNodes that have a blocking taint.

The placement admission policy (``sandlot.api.placementpolicy``) can only select
its SandboxNodes by label, so the label must follow the taints: the admin's
``spec.taints`` and the agent's mirrored ``status.nodeTaints``. Each node event
asks ``policy.placement.tainted_label`` and applies its answer with the
resourceVersion it was decided on (a 409: a newer event decides again). Only the
leader writes. A new leader missed the events of its predecessor's term: the node
resync timer (``controllers.operator``, one timer per node for every controller)
calls ``sync`` too.

Both run on the event loop: the decision is pure and almost always "nothing to do",
so only a write goes to a thread (kopf would run a plain function in its executor
for every event and every tick, 5,000 thread hand-offs a resync at 5,000 nodes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import kopf

from sandlot.adapters.objects import Objects
from sandlot.api.common import GROUP, NODES, VERSION
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


async def sync(objects: Objects, body: Any) -> bool:
    """``sync_label`` decided on the loop, its write (if any) in a thread."""
    if tainted_label(body) is None:
        return False
    return await asyncio.to_thread(sync_label, objects, body)


def register(
    registry: kopf.OperatorRegistry,
    objects: Objects,
    leading: Callable[[], bool],
) -> None:
    @kopf.on.event(GROUP, VERSION, NODES, registry=registry)
    async def node_taints(body: kopf.Body, **kwargs: Any) -> None:
        if kwargs.get("type") == "DELETED" or not leading():
            return
        await sync(objects, body)


__all__ = ["register", "sync", "sync_label"]
