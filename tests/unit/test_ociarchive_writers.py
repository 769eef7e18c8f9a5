"""Two builders of the same OCI archive at once (``make setup`` and a test module
building the cluster image, say): each must rename a whole file of its own into
place. Real files and threads; a rendezvous before the rename makes the worst
interleaving, both written and neither renamed yet, happen every time."""

from __future__ import annotations

import io
import json
import tarfile
import threading
from pathlib import Path

import pytest

from sandlot.devtools.ociarchive import build_layers_archive

NAME = "docker.io/sandlot/writers:test"
WRITERS = 2


def _layer() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"#!/bin/sh\necho hello\n"
        info = tarfile.TarInfo("hello")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_concurrent_writers_of_one_archive_each_rename_a_whole_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "images" / "writers.tar"
    layer, config = _layer(), {"Cmd": ["/hello"]}
    expected = build_layers_archive(tmp_path / "alone.tar", NAME, [layer], config)

    # Every writer waits here with its temporary file written, then renames it.
    rendezvous = threading.Barrier(WRITERS, timeout=30)
    real_replace = Path.replace

    def replace_after_rendezvous(self: Path, target: str | Path) -> Path:
        if Path(target) == dest:
            rendezvous.wait()
        return real_replace(self, target)

    monkeypatch.setattr(Path, "replace", replace_after_rendezvous)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            build_layers_archive(dest, NAME, [layer], config)
        except BaseException as exc:  # reported below, with the writer's failure
            errors.append(exc)
            rendezvous.abort()

    writers = [threading.Thread(target=write, name=f"writer-{i}") for i in range(WRITERS)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=60)
    assert not any(w.is_alive() for w in writers), "a writer did not finish within 60 s"
    assert errors == [], f"a concurrent writer failed: {errors!r}"

    assert dest.read_bytes() == expected.path.read_bytes()
    with tarfile.open(dest) as tar:
        member = tar.extractfile("index.json")
        assert member is not None
        index = json.loads(member.read())
    assert index["manifests"][0]["digest"] == expected.manifest_digest
    assert sorted(p.name for p in dest.parent.iterdir()) == ["writers.tar"], (
        "a temporary file stayed"
    )
