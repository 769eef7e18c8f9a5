"""``sandlot cp`` of a directory: what to make and copy, and where. Pure.

The same plan serves both ways. A walk (``walk_tree``) asks a lister for one
directory's entries at a time, the local disk's or the agent's ``list``, and
gives back the directories to make (parents first) and the regular files to
copy, as paths relative to the copy's root. Symlinks are never followed, either
way: each is skipped and named, as are sockets, devices and pipes, since the
protocol makes neither, and following one would copy what lies outside the tree
the user named (a link to ``~/.ssh`` going in, a sandbox's link to ``/etc``
coming out). A name a sandbox lists is checked before it is ever joined to a
local path, so no listing makes the CLI write outside the directory it was given.

The walk is bounded (``MAX_TREE_ENTRIES`` entries, ``MAX_TREE_DEPTH`` levels) and
refuses past either before anything is copied.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# The ``type`` of an entry, as the agent's list and stat say it.
DIR, FILE, SYMLINK, OTHER = "dir", "file", "symlink", "other"
MAX_TREE_ENTRIES = 10_000  # entries in one copied tree, directories included
MAX_TREE_DEPTH = 32  # levels of directories below the copy's root

Parts = tuple[str, ...]  # a path relative to the copy's root, one name a part
Lister = Callable[[Parts], Sequence[tuple[str, str]]]  # (name, type) of a directory's entries


class TreeRefused(ValueError):
    """A tree that will not be copied; its text names the path and why."""


@dataclass(frozen=True)
class TreePlan:
    dirs: tuple[Parts, ...]  # to make, each after its parent; the root itself excluded
    files: tuple[Parts, ...]  # regular files to copy
    skipped: tuple[tuple[Parts, str], ...]  # (path, type) of what is not copied


def check_name(name: str, where: str) -> None:
    """Refuse an entry name that is not one plain name (``TreeRefused``)."""
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        raise TreeRefused(f"{where}: lists an entry named {name!r}, which is not a plain name")


def walk_tree(
    root: str,
    list_dir: Lister,
    *,
    max_entries: int = MAX_TREE_ENTRIES,
    max_depth: int = MAX_TREE_DEPTH,
) -> TreePlan:
    """The plan of the tree under ``root`` (named in messages), whose directories
    ``list_dir`` lists; ``TreeRefused`` past a bound or at a name that is not one."""
    dirs: list[Parts] = []
    files: list[Parts] = []
    skipped: list[tuple[Parts, str]] = []
    count = 0
    pending: list[Parts] = [()]
    while pending:
        here = pending.pop()
        where = join(root, here)
        children: list[Parts] = []
        for name, kind in sorted(list_dir(here)):
            check_name(name, where)
            count += 1
            if count > max_entries:
                raise TreeRefused(f"{root}: more than {max_entries} entries; copy a smaller tree")
            path = (*here, name)
            if kind == DIR:
                if len(path) > max_depth:
                    raise TreeRefused(
                        f"{join(root, path)}: deeper than {max_depth} directories below {root}"
                    )
                dirs.append(path)
                children.append(path)
            elif kind == FILE:
                files.append(path)
            else:
                skipped.append((path, kind))
        pending.extend(reversed(children))  # depth first, in name order
    return TreePlan(tuple(dirs), tuple(files), tuple(skipped))


def join(root: str, parts: Parts) -> str:
    """``parts`` below ``root``, with ``/`` (the sandbox's separator, and Linux's)."""
    return posixpath.join(root, *parts) if parts else root


def copy_root(source: str, dest: str, dest_is_dir: bool) -> str:
    """Where the copy of ``source`` goes, as ``cp -r`` and ``kubectl cp`` decide: into
    an existing directory ``dest`` under the source's own name, else ``dest`` itself."""
    name = posixpath.basename(posixpath.normpath(source))
    if not dest_is_dir or name in ("", "/", ".", ".."):
        return dest
    return posixpath.join(dest, name)


def skipped_line(root: str, path: Parts, kind: str) -> str:
    """The warning for an entry the copy leaves out."""
    if kind == SYMLINK:
        return f"skipped {join(root, path)}: a symlink, never followed"
    return f"skipped {join(root, path)}: not a regular file or directory"


__all__ = [
    "DIR",
    "FILE",
    "MAX_TREE_DEPTH",
    "MAX_TREE_ENTRIES",
    "OTHER",
    "SYMLINK",
    "Lister",
    "Parts",
    "TreePlan",
    "TreeRefused",
    "check_name",
    "copy_root",
    "join",
    "skipped_line",
    "walk_tree",
]
