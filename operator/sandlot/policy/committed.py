"""Images sandlot commits on a node, and which sandboxes may start them: pure.

A snapshot (``sandlot.local/snapshots/<uid>``) and a suspended sandbox's filesystem
(``sandlot.local/suspended/<uid>``) are committed into the node's image store. They
were never pulled, so the per-credential check would take them for preloaded images
any sandbox may use: a Sandbox of another tenant naming one in ``spec.image`` would
run that filesystem. So ``spec.image`` may not name them (the CRD refuses it, and the
agent again for an object stored before), and each committed image carries the
namespace of the object it was committed for: it starts only for a Sandbox of that
namespace. Forks reach a snapshot through ``spec.snapshotRef`` (same namespace) and
restores through their own uid, never through ``spec.image``.
"""

from __future__ import annotations

from collections.abc import Mapping

from sandlot.policy.snapshots import SNAPSHOT_IMAGE_LABEL, SNAPSHOT_IMAGE_PREFIX
from sandlot.policy.suspension import SUSPENDED_IMAGE_LABEL, SUSPENDED_IMAGE_PREFIX

COMMITTED_PREFIXES = (SNAPSHOT_IMAGE_PREFIX, SUSPENDED_IMAGE_PREFIX)
"""The names of the images sandlot commits (a registry host and a repository)."""
OWNER_LABELS = (SNAPSHOT_IMAGE_LABEL, SUSPENDED_IMAGE_LABEL)
"""Labels on a committed image naming its owner as ``<namespace>.<name>``."""


def is_committed_name(image: str) -> bool:
    """``image`` names one of the repositories sandlot commits into (any tag or digest,
    the registry host in any case: containerd and a resolver may read it so)."""
    host, _, rest = image.strip().partition("/")
    name = f"{host.lower()}/{rest}"
    return any(name.startswith(prefix) for prefix in COMMITTED_PREFIXES)


def spec_image_refusal(image: str) -> str | None:
    """Why a Sandbox may not name ``image`` in ``spec.image``; None when it may."""
    if not is_committed_name(image):
        return None
    return (
        f"spec.image: {image} names an image sandlot committed (a snapshot or a "
        "suspended sandbox), which no Sandbox may name; fork a snapshot with "
        "spec.snapshotRef"
    )


def owner_namespace(labels: Mapping[str, str] | None) -> str | None:
    """The namespace a committed image belongs to, from its owner label (a namespace
    holds no dots, so it is what comes before the first); None when unlabelled."""
    for key in OWNER_LABELS:
        value = (labels or {}).get(key)
        if value:
            return value.split(".", 1)[0]
    return None


def start_refusal(image: str, labels: Mapping[str, str] | None, namespace: str) -> str | None:
    """Why a Sandbox of ``namespace`` may not start from committed ``image`` whose
    record carries ``labels``; None when it may (its own namespace's, or a pulled
    state without labels: its reference came from the Sandbox's own objects)."""
    owner = owner_namespace(labels)
    if owner is None or owner == namespace:
        return None
    return f"image {image} was committed for namespace {owner}, not {namespace}"


__all__ = [
    "COMMITTED_PREFIXES",
    "OWNER_LABELS",
    "is_committed_name",
    "owner_namespace",
    "spec_image_refusal",
    "start_refusal",
]
