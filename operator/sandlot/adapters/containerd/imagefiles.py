"""Small files out of an image's layers, without unpacking it: the image's
``/etc/passwd`` and ``/etc/group`` for resolving a named ``USER``.

Layers are read top-down; the first layer that has the file (or a whiteout of it)
decides, as an overlay mount of the layers would. Only images that name their
user pay for this read, and it is bounded by the caller's deadline.
"""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sandlot.adapters.runtime import RuntimeError_

MAX_FILE_BYTES = 1 << 20  # a passwd or group file larger than this is not one


def _layer_tar(media_type: str, blob: bytes) -> tarfile.TarFile:
    if media_type.endswith("+zstd"):
        raise RuntimeError_(f"layer of type {media_type} cannot be read here", code="invalid")
    if media_type.endswith("gzip") or blob[:2] == b"\x1f\x8b":
        blob = gzip.decompress(blob)
    return tarfile.open(fileobj=io.BytesIO(blob), mode="r:")


def read_image_files(
    layers: Sequence[Mapping[str, Any]], read_blob: Callable[[str], bytes], paths: Sequence[str]
) -> dict[str, str]:
    """The text of each of ``paths`` (absolute) as the image's root filesystem has
    it; a path the image lacks maps to ''."""
    wanted = {p.lstrip("/"): p for p in paths}
    found: dict[str, str] = {}
    for layer in reversed(layers):
        if len(found) == len(wanted):
            break
        archive = _layer_tar(str(layer.get("mediaType", "")), read_blob(str(layer["digest"])))
        with archive:
            for member in archive:
                name = member.name.removeprefix("./")
                directory, _, base = name.rpartition("/")
                whited = f"{directory}/{base.removeprefix('.wh.')}".lstrip("/")
                if base.startswith(".wh.") and whited in wanted and whited not in found:
                    found[whited] = ""
                elif name in wanted and name not in found and member.isfile():
                    if member.size > MAX_FILE_BYTES:
                        raise RuntimeError_(f"/{name} in the image is too large", code="invalid")
                    handle = archive.extractfile(member)
                    found[name] = handle.read().decode(errors="replace") if handle else ""
    return {wanted[name]: found.get(name, "") for name in wanted}
