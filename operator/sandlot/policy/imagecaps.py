"""How much of an image's data the agent reads, at most: every read of registry or
content-store data is streamed and stops at its cap, so a hostile image (a 100 MiB
manifest, a 1 GiB config, a gzip bomb under a named ``USER``) costs the agent a
bounded amount of memory and time and fails its sandbox naming the cap, instead
of growing the agent past its own memory limit.
"""

from __future__ import annotations

MAX_MANIFEST_BYTES = 4 * 2**20
"""A manifest or index larger than this is refused (containerd's own cap)."""
MAX_CONFIG_BYTES = 8 * 2**20
"""An image config larger than this is refused, whatever its descriptor says (a
config is a few KiB; its history makes it grow, not to megabytes)."""
MAX_USER_LOOKUP_BYTES = 512 * 2**20
"""Bytes of layer content (decompressed) read looking for ``/etc/passwd`` and
``/etc/group`` to resolve a ``USER`` given by name; the lookup reads layers top
down and stops at the files, so only images that bury them under this much
content fail."""
MAX_UNPACKED_LAYER_BYTES = 16 * 2**30
"""Default cap on the bytes one layer unpacks to (its tar, decompressed, with sparse
files at their full size), counted as it is fetched; the agent's
``image_max_unpacked_layer`` setting."""
MAX_UNPACKED_IMAGE_BYTES = 32 * 2**30
"""Default cap on the bytes all the layers one pull unpacks add up to; the agent's
``image_max_unpacked`` setting."""


def mib(count: int) -> str:
    """``count`` bytes for a message naming a cap: in MiB when whole ones."""
    if count and count % 2**30 == 0:
        return f"{count >> 30} GiB"
    return f"{count >> 20} MiB" if count and count % 2**20 == 0 else f"{count} bytes"


__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_MANIFEST_BYTES",
    "MAX_UNPACKED_IMAGE_BYTES",
    "MAX_UNPACKED_LAYER_BYTES",
    "MAX_USER_LOOKUP_BYTES",
    "mib",
]
