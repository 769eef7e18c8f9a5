"""Build small OCI image archives locally, and import them into containerd.

Tests and the local demo need real images without a registry. An image here is
a static busybox in one layer plus, optionally, a second layer of caller files
and a filler of a chosen size, so many *distinct* images of chosen sizes cost a
few milliseconds each and share the busybox layer in the content store.

The archives are deterministic (fixed times, owners and order; layers stored
uncompressed unless asked), so the same inputs give the same digests.

Importing goes through ``ctr images import``: it writes the content *and*
unpacks it for the snapshotter, which the gRPC Content/Images API alone does
not do. ``ctr`` use stays inside this module.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import secrets
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandlot.adapters.runtime import RuntimeError_, RuntimeTimeout

BUSYBOX = Path("/bin/busybox")
# Applets linked into /bin so images run common commands without a full install.
APPLETS = (
    "sh",
    "cat",
    "echo",
    "env",
    "false",
    "true",
    "ls",
    "sleep",
    "kill",
    "ps",
    "mkdir",
    "rm",
    "touch",
    "dd",
    "head",
    "id",
    "trap",
)
DIRECTORIES = ("bin", "dev", "etc", "proc", "sys", "tmp", "usr", "usr/bin")

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ANNOTATION_IMAGE_NAME = "io.containerd.image.name"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"

_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


@dataclass(frozen=True)
class ImageArchive:
    path: Path
    name: str
    manifest_digest: str  # the image's target: its manifest, or its index with ``as_index``
    size: int  # bytes of the blobs in the archive (index, manifest, config, layers)


def host_platform() -> dict[str, str]:
    machine = platform.machine().lower()
    return {"architecture": _GOARCH.get(machine, machine), "os": "linux"}


def _tar_entry(
    name: str, *, kind: bytes, size: int = 0, mode: int, link: str = ""
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = mode
    info.linkname = link
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _tar(entries: Sequence[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _parents(path: str) -> list[str]:
    parts = path.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _files_layer(files: Mapping[str, bytes], executables: frozenset[str] = frozenset()) -> bytes:
    directories = sorted({d for path in files for d in _parents(path)})
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_tar_entry(d, kind=tarfile.DIRTYPE, mode=0o755), None) for d in directories
    ]
    for path in sorted(files):
        data = files[path]
        mode = 0o755 if path in executables else 0o644
        entries.append((_tar_entry(path, kind=tarfile.REGTYPE, size=len(data), mode=mode), data))
    return _tar(entries)


def _busybox_layer(busybox: Path) -> bytes:
    binary = busybox.read_bytes()
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_tar_entry(d, kind=tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755), None)
        for d in DIRECTORIES
    ]
    entries.append(
        (_tar_entry("bin/busybox", kind=tarfile.REGTYPE, size=len(binary), mode=0o755), binary)
    )
    for applet in APPLETS:
        entries.append(
            (_tar_entry(f"bin/{applet}", kind=tarfile.SYMTYPE, mode=0o777, link="busybox"), None)
        )
    return _tar(entries)


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _store_manifest(
    blobs: dict[str, bytes],
    layers: Sequence[bytes],
    compress: bool,
    plat: Mapping[str, str],
    image_config: Mapping[str, object],
) -> tuple[dict[str, object], bytes]:
    """Store ``layers``, their config and their manifest in ``blobs``; the manifest's
    descriptor and its bytes."""
    layer_descriptors, diff_ids = _store_layers(blobs, layers, compress)
    config = _store(blobs, _config_blob(plat, image_config, diff_ids))
    manifest = _canonical(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_MANIFEST,
            "config": _descriptor(MEDIA_CONFIG, config),
            "layers": layer_descriptors,
        }
    )
    return _descriptor(MEDIA_MANIFEST, _store(blobs, manifest)), manifest


def build_image_archive(
    dest: Path,
    name: str,
    *,
    busybox: Path = BUSYBOX,
    entrypoint: Sequence[str] = (),
    cmd: Sequence[str] = ("/bin/sh",),
    env: Sequence[str] = ("PATH=/usr/bin:/bin",),
    working_dir: str = "/",
    extra_files: Mapping[str, bytes] | None = None,
    executable_files: Mapping[str, bytes] | None = None,
    user: str = "",
    filler_bytes: int = 0,
    salt: str = "",
    compress: bool = False,
    as_index: bool = False,
) -> ImageArchive:
    """Write an OCI image archive for ``name`` (e.g. ``docker.io/sandlot/busybox:1``) to ``dest``.

    ``extra_files`` (mode 0644), ``executable_files`` (0755), ``filler_bytes`` and
    ``salt`` go into a second layer: a
    ``salt`` alone makes an image distinct, ``filler_bytes`` makes it that much
    bigger (the filler is ``/filler``, zeros).

    ``as_index`` makes the image a multi-platform index, as registries serve most
    images: this platform's manifest, plus an entry for another platform whose
    content is not in the archive (as after a single-platform pull).
    """
    if not busybox.is_file():
        raise FileNotFoundError(f"{busybox} not found (Debian package busybox-static)")
    layers = _image_layers(busybox, extra_files, executable_files, filler_bytes, salt)
    blobs: dict[str, bytes] = {}
    plat = host_platform()
    image_config = {
        "Entrypoint": list(entrypoint) or None,
        "Cmd": list(cmd) or None,
        "Env": list(env),
        "WorkingDir": working_dir,
        **({"User": user} if user else {}),
    }
    top, manifest = _store_manifest(blobs, layers, compress, plat, image_config)
    if as_index:
        top = _descriptor(MEDIA_INDEX, _store(blobs, _platform_index(top, manifest, plat)))
    index = _layout_index(top, name, None if as_index else plat)
    _write_archive(dest, blobs, index)
    size = sum(len(b) for b in blobs.values())
    return ImageArchive(dest, name, str(top["digest"]), size)


def build_layers_archive(
    dest: Path, name: str, layers: Sequence[bytes], image_config: Mapping[str, object]
) -> ImageArchive:
    """Write an OCI image archive of ``layers`` (uncompressed tars, bottom first) with
    ``image_config`` (``Entrypoint``, ``Cmd``, ``Env``, ``User``, ...) to ``dest``."""
    blobs: dict[str, bytes] = {}
    plat = host_platform()
    top, _ = _store_manifest(blobs, layers, False, plat, image_config)
    _write_archive(dest, blobs, _layout_index(top, name, plat))
    return ImageArchive(dest, name, str(top["digest"]), sum(len(b) for b in blobs.values()))


def directory_layer(root: Path, *, only: Sequence[str] = ()) -> bytes:
    """A layer holding the tree under ``root`` (or only its subtrees ``only``), owners,
    modes and times kept (Python's bytecode caches are valid only for their source's
    mtime), entries sorted."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tops = [root / p for p in only] if only else sorted(root.iterdir())
        for parent in sorted({d for p in only for d in _parents(p.strip("/") + "/x")} - {""}):
            if parent != "" and (root / parent).is_dir() and parent not in only:
                tar.add(root / parent, arcname=parent, recursive=False)
        for top in tops:
            tree = top.is_dir() and not top.is_symlink()  # /bin -> usr/bin is a link
            for path in [top, *sorted(top.rglob("*"))] if tree else [top]:
                arcname = str(path.relative_to(root))
                tar.add(path, arcname=arcname, recursive=False)
    return buf.getvalue()


def _image_layers(
    busybox: Path,
    extra_files: Mapping[str, bytes] | None,
    executable_files: Mapping[str, bytes] | None,
    filler_bytes: int,
    salt: str,
) -> list[bytes]:
    """The busybox layer, and a second one when there are files, a salt or a filler."""
    layers = [_busybox_layer(busybox)]
    files = {path.lstrip("/"): data for path, data in (extra_files or {}).items()}
    executables = frozenset(path.lstrip("/") for path in executable_files or {})
    files.update({path.lstrip("/"): data for path, data in (executable_files or {}).items()})
    if salt:
        files[".sandlot-salt"] = salt.encode()
    if filler_bytes:
        files["filler"] = bytes(filler_bytes)
    if files:
        layers.append(_files_layer(files, executables))
    return layers


def _store(blobs: dict[str, bytes], data: bytes) -> bytes:
    blobs[_digest(data)] = data
    return data


def _descriptor(media_type: str, data: bytes) -> dict[str, object]:
    return {"mediaType": media_type, "digest": _digest(data), "size": len(data)}


def _store_layers(
    blobs: dict[str, bytes], layers: Sequence[bytes], compress: bool
) -> tuple[list[dict[str, object]], list[str]]:
    """Each layer as a blob (gzipped with ``compress``): its descriptors and diff IDs."""
    descriptors = []
    diff_ids = []
    for layer in layers:
        diff_ids.append(_digest(layer))
        blob = _store(blobs, gzip.compress(layer, mtime=0) if compress else layer)
        descriptors.append(_descriptor(MEDIA_LAYER_GZIP if compress else MEDIA_LAYER, blob))
    return descriptors, diff_ids


def _config_blob(
    plat: Mapping[str, str], image_config: Mapping[str, object], diff_ids: Sequence[str]
) -> bytes:
    return _canonical(
        {
            **plat,
            "created": "1970-01-01T00:00:00Z",
            "config": dict(image_config),
            "rootfs": {"type": "layers", "diff_ids": list(diff_ids)},
        }
    )


def _platform_index(top: Mapping[str, object], manifest: bytes, plat: Mapping[str, str]) -> bytes:
    """A multi-platform index: this platform's manifest, and another platform's entry
    whose content the archive does not hold."""
    other = {"architecture": "s390x" if plat["architecture"] != "s390x" else "amd64"}
    return _canonical(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {**top, "platform": plat},
                {
                    "mediaType": MEDIA_MANIFEST,
                    "digest": _digest(b"absent " + manifest),
                    "size": len(manifest),
                    "platform": {**other, "os": "linux"},
                },
            ],
        }
    )


def _layout_index(top: Mapping[str, object], name: str, plat: Mapping[str, str] | None) -> bytes:
    """The archive's ``index.json``: the image's target, named for ``ctr`` to import."""
    tag = name.rsplit(":", 1)[1] if ":" in name.rsplit("/", 1)[-1] else "latest"
    return _canonical(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                {
                    **top,
                    **({} if plat is None else {"platform": plat}),
                    "annotations": {ANNOTATION_IMAGE_NAME: name, ANNOTATION_REF_NAME: tag},
                }
            ],
        }
    )


def _write_archive(dest: Path, blobs: Mapping[str, bytes], index: bytes) -> None:
    """The OCI layout as a tar, written whole and then renamed into place."""
    layout = _canonical({"imageLayoutVersion": "1.0.0"})
    entries: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_tar_entry("blobs", kind=tarfile.DIRTYPE, mode=0o755), None),
        (_tar_entry("blobs/sha256", kind=tarfile.DIRTYPE, mode=0o755), None),
    ]
    for digest in sorted(blobs):
        data = blobs[digest]
        path = "blobs/sha256/" + digest.split(":", 1)[1]
        entries.append((_tar_entry(path, kind=tarfile.REGTYPE, size=len(data), mode=0o644), data))
    for path, data in (("oci-layout", layout), ("index.json", index)):
        entries.append((_tar_entry(path, kind=tarfile.REGTYPE, size=len(data), mode=0o644), data))
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A name of this writer's own: two processes building the same archive at once
    # (same inputs, same bytes) each rename a whole file into place; none sees half.
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_bytes(_tar(entries))
        tmp.replace(dest)
    finally:
        tmp.unlink(missing_ok=True)


def import_archive(
    address: str,
    namespace: str,
    path: Path,
    *,
    snapshotter: str = "overlayfs",
    timeout: float = 60.0,
    ctr: str = "ctr",
) -> None:
    """Import (and unpack for ``snapshotter``) an OCI archive with ``ctr``, within ``timeout``."""
    argv = [
        ctr,
        "--address",
        address,
        "--namespace",
        namespace,
        "images",
        "import",
        "--snapshotter",
        snapshotter,
        str(path),
    ]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeTimeout(
            f"ctr images import {path} did not finish within {timeout:g}s"
        ) from exc
    except FileNotFoundError as exc:
        raise RuntimeError_(f"ctr images import {path}: {ctr} is not installed") from exc
    if proc.returncode != 0:
        raise RuntimeError_(
            f"ctr images import {path} failed (exit {proc.returncode}): {proc.stderr.strip()}"
        )
