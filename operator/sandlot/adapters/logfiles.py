"""The file operations behind ``policy.sandboxlogs``: list, rotate, remove."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path


def log_sizes(directory: str | Path) -> dict[str, int]:
    """File name -> size of the regular files in ``directory`` (empty when it is absent)."""
    sizes: dict[str, int] = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False):
                    sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
    return sizes


def rotate(path: str | Path, rotated_suffix: str = ".1") -> None:
    """Copy ``path`` to ``path + rotated_suffix`` (replacing it), then truncate ``path``
    in place: a writer appending to it carries on at its new end."""
    source = Path(path)
    target = source.with_name(source.name + rotated_suffix)
    tmp = source.with_name(source.name + rotated_suffix + ".tmp")
    shutil.copyfile(source, tmp)
    tmp.replace(target)
    with source.open("r+b") as handle:
        handle.truncate(0)


def remove(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()


__all__ = ["log_sizes", "remove", "rotate"]
