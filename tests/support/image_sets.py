"""Many small distinct images in one OCI archive, imported with one ``ctr`` call.

Image GC tests and the GC bench need dozens to hundreds of distinct images. One
archive per image would cost a ``ctr images import`` process each; here every
image is built by ``build_image_archive`` (a salt makes each distinct, a filler
sets its size) and the archives are merged: blobs are content-addressed, so the
shared busybox layer is stored once, and ``index.json`` lists every image with
its name annotation, so one import creates (and unpacks) all of them.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from sandlot.devtools.ociarchive import build_image_archive, import_archive


def build_image_set(dest: Path, names: Sequence[str], *, filler_bytes: int = 0) -> Path:
    """Write one archive holding an image per name, each distinct (salted by its name)."""
    blobs: dict[str, bytes] = {}
    manifests: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="sl-imgset-") as scratch:
        for i, name in enumerate(names):
            single = Path(scratch) / f"{i}.tar"
            build_image_archive(single, name, salt=name, filler_bytes=filler_bytes)
            with tarfile.open(single) as tar:
                for member in tar.getmembers():
                    if not member.isfile():
                        continue
                    extracted = tar.extractfile(member)
                    assert extracted is not None, member.name
                    data = extracted.read()
                    if member.name.startswith("blobs/sha256/"):
                        blobs[member.name] = data
                    elif member.name == "index.json":
                        manifests.extend(json.loads(data)["manifests"])
            single.unlink()
    index = json.dumps({"schemaVersion": 2, "manifests": manifests}, sort_keys=True).encode()
    layout = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as out:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            out.addfile(info)
        for path in sorted(blobs):
            _add(out, path, blobs[path])
        _add(out, "oci-layout", layout)
        _add(out, "index.json", index)
    return dest


def _add(tar: tarfile.TarFile, path: str, data: bytes) -> None:
    info = tarfile.TarInfo(path)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def allocated_bytes(path: Path) -> int:
    """Bytes allocated to the files under ``path``, measured on disk (what ``du`` counts)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:  # removed while walking
                continue
    return total


def import_image_set(address: str, namespace: str, archive: Path, *, timeout: float = 120) -> None:
    import_archive(address, namespace, archive, timeout=timeout)


__all__ = ["allocated_bytes", "build_image_set", "import_image_set"]
