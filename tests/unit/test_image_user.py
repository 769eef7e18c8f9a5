"""A named image ``USER`` resolves through the image's own /etc/passwd and /etc/group."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest

from sandlot.adapters.containerd.imagefiles import read_image_files
from sandlot.adapters.runtime import ImageTooLarge
from sandlot.api.sandbox import SandboxSpec
from sandlot.policy.imageuser import ResolvedUser, UnknownImageUser, needs_lookup, resolve_user
from sandlot.policy.ocispec import ImageConfig, build_oci_spec

PASSWD = """root:x:0:0:root:/root:/bin/sh
# a comment
app:x:1000:1001:app:/home/app:/bin/sh
svc:x:2000:2000::/:/bin/false
broken line
"""
GROUP = """root:x:0:
appgrp:x:1001:
staff:x:50:app,svc
audio:x:63:app
"""


@pytest.mark.parametrize(
    ("user", "resolved"),
    [
        ("app", ResolvedUser(1000, 1001, (50, 63))),
        ("app:staff", ResolvedUser(1000, 50, (63,))),
        ("app:7", ResolvedUser(1000, 7, (50, 63))),
        ("1000", ResolvedUser(1000, 1001, (50, 63))),
        ("4242", ResolvedUser(4242, 0, ())),
        ("4242:staff", ResolvedUser(4242, 50, ())),
        ("svc", ResolvedUser(2000, 2000, (50,))),
    ],
    ids=[
        "name: passwd gid and member groups",
        "name and group name",
        "name and numeric group",
        "uid with an entry",
        "uid without an entry runs with gid 0",
        "uid and group name",
        "another member",
    ],
)
def test_resolve_user(user: str, resolved: ResolvedUser) -> None:
    assert resolve_user(user, PASSWD, GROUP) == resolved


@pytest.mark.parametrize(
    ("user", "missing"),
    [("nobody", "user 'nobody'"), ("app:wheel", "group 'wheel'"), ("app", "user 'app'")],
    ids=["unknown user", "unknown group", "image without passwd"],
)
def test_unknown_names_refuse_rather_than_run_as_root(user: str, missing: str) -> None:
    passwd = "" if missing == "user 'app'" else PASSWD
    with pytest.raises(UnknownImageUser, match=missing):
        resolve_user(user, passwd, GROUP)


@pytest.mark.parametrize(
    ("user", "lookup"),
    [("", False), ("1000", False), ("1000:50", False), ("app", True), ("1000:staff", True)],
    ids=["none", "uid", "uid:gid", "name", "group name"],
)
def test_only_names_need_the_image_files(user: str, lookup: bool) -> None:
    assert needs_lookup(user) is lookup


def _spec(**context: Any) -> SandboxSpec:
    return SandboxSpec.model_validate(
        {"image": "img", "command": ["sh"], "securityContext": context}
    )


def test_named_image_user_reaches_the_oci_spec_with_its_groups() -> None:
    config = ImageConfig(user="app", passwd=PASSWD, group=GROUP)
    oci = build_oci_spec("sb", _spec(), config, hostname="b")
    assert oci["process"]["user"] == {"uid": 1000, "gid": 1001, "additionalGids": [50, 63]}


def test_run_as_user_overrides_a_named_image_user() -> None:
    config = ImageConfig(user="app", passwd=PASSWD, group=GROUP)
    oci = build_oci_spec("sb", _spec(runAsUser=5, runAsGroup=6), config, hostname="b")
    assert oci["process"]["user"] == {"uid": 5, "gid": 6}


def test_run_as_non_root_is_satisfied_by_a_named_non_root_image_user() -> None:
    config = ImageConfig(user="app", passwd=PASSWD, group=GROUP)
    oci = build_oci_spec("sb", _spec(runAsNonRoot=True), config, hostname="b")
    assert oci["process"]["user"]["uid"] == 1000


# ------------------------------------------------------------------ reading the layers


def _layer(files: dict[str, bytes], *, compress: bool = False) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(buffer.getvalue()) if compress else buffer.getvalue()


def test_the_top_layer_with_the_file_wins_and_a_whiteout_hides_it() -> None:
    blobs = {
        "sha256:a": _layer({"etc/passwd": b"root:x:0:0::/:/bin/sh\n", "etc/group": b"g:x:1:\n"}),
        "sha256:b": _layer({"./etc/passwd": b"app:x:1000:1000::/:/bin/sh\n"}, compress=True),
        "sha256:c": _layer({"etc/.wh.group": b""}),
    }
    layers = [
        {"digest": "sha256:a", "mediaType": "application/vnd.oci.image.layer.v1.tar"},
        {"digest": "sha256:b", "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip"},
        {"digest": "sha256:c", "mediaType": "application/vnd.oci.image.layer.v1.tar"},
    ]
    files = read_image_files(
        layers, lambda d: _chunks(blobs[d]), ("/etc/passwd", "/etc/group"), max_bytes=2**20
    )
    assert files == {"/etc/passwd": "app:x:1000:1000::/:/bin/sh\n", "/etc/group": ""}


def _chunks(blob: bytes, size: int = 100) -> Iterator[bytes]:
    """A blob in small chunks, as the content store streams it."""
    for start in range(0, len(blob), size):
        yield blob[start : start + size]


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "gzip"])
def test_the_lookup_stops_at_its_cap_on_bytes_read(compress: bool) -> None:
    blob = _layer(
        {"filler": bytes(64 * 1024), "etc/passwd": b"app:x:1:1::/:/bin/sh\n"}, compress=compress
    )
    layers = [{"digest": "sha256:a", "mediaType": "application/vnd.oci.image.layer.v1.tar"}]
    with pytest.raises(ImageTooLarge, match="more than 32768 bytes of layer content"):
        read_image_files(layers, lambda d: _chunks(blob), ("/etc/passwd",), max_bytes=32 * 1024)
    found = read_image_files(layers, lambda d: _chunks(blob), ("/etc/passwd",), max_bytes=2**20)
    assert found == {"/etc/passwd": "app:x:1:1::/:/bin/sh\n"}
