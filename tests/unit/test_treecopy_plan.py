"""The plan of a directory copy (``policy.treecopy``): what is made and copied, what
is skipped, where the copy lands, and the bounds and names it refuses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from sandlot.cli.treecopy import local_lister
from sandlot.policy.streams import (
    FILES,
    MKDIR,
    StreamRequest,
    agent_request,
    api_path,
    parse_agent_request,
    parse_api_request,
)
from sandlot.policy.treecopy import (
    DIR,
    FILE,
    OTHER,
    SYMLINK,
    Lister,
    Parts,
    TreeRefused,
    copy_root,
    skipped_line,
    walk_tree,
)

Tree = Mapping[Parts, Sequence[tuple[str, str]]]


def lister(tree: Tree) -> Lister:
    def list_dir(parts: Parts) -> Sequence[tuple[str, str]]:
        return tree[parts]

    return list_dir


NESTED: Tree = {
    (): [("b", DIR), ("a.txt", FILE), ("empty", DIR), ("link", SYMLINK), ("fifo", OTHER)],
    ("b",): [("c", DIR), ("z.bin", FILE)],
    ("b", "c"): [("deep.txt", FILE)],
    ("empty",): [],
}


def test_a_walk_makes_every_directory_after_its_parent_and_copies_every_file() -> None:
    plan = walk_tree("src", lister(NESTED))
    assert sorted(plan.dirs) == [("b",), ("b", "c"), ("empty",)]
    assert all(plan.dirs.index(d[:-1]) < i for i, d in enumerate(plan.dirs) if len(d) > 1)
    assert sorted(plan.files) == [("a.txt",), ("b", "c", "deep.txt"), ("b", "z.bin")]
    assert plan.skipped == ((("fifo",), OTHER), (("link",), SYMLINK))


def test_a_symlink_is_skipped_and_named_never_listed_as_a_directory() -> None:
    listed: list[Parts] = []

    def list_dir(parts: Parts) -> Sequence[tuple[str, str]]:
        listed.append(parts)
        return NESTED[parts]

    walk_tree("src", list_dir)
    assert ("link",) not in listed
    assert skipped_line("box:/tmp/t", ("link",), SYMLINK) == (
        "skipped box:/tmp/t/link: a symlink, never followed"
    )


@pytest.mark.parametrize(
    "name",
    ["..", ".", "", "a/b", "../../etc", "x\x00y"],
    ids=["dotdot", "dot", "empty", "slash", "dotdot-slash", "nul"],
)
def test_an_entry_that_is_not_one_plain_name_is_refused_naming_the_directory(name: str) -> None:
    tree: Tree = {(): [("ok", DIR)], ("ok",): [(name, FILE)]}
    with pytest.raises(TreeRefused, match=r"box:/src/ok: lists an entry named"):
        walk_tree("box:/src", lister(tree))


def test_a_tree_past_the_entry_cap_is_refused_before_anything_is_copied() -> None:
    tree: Tree = {(): [(f"f{i}", FILE) for i in range(6)]}
    assert len(walk_tree("src", lister(tree), max_entries=6).files) == 6
    with pytest.raises(TreeRefused, match="src: more than 5 entries"):
        walk_tree("src", lister(tree), max_entries=5)


def test_a_tree_deeper_than_the_depth_cap_is_refused_naming_the_directory() -> None:
    tree: Tree = {tuple("d" * i): [("d", DIR)] for i in range(4)}
    tree = {**tree, tuple("d" * 4): []}
    assert len(walk_tree("src", lister(tree), max_depth=4).dirs) == 4
    with pytest.raises(TreeRefused, match="src/d/d/d/d: deeper than 3 directories below src"):
        walk_tree("src", lister(tree), max_depth=3)


@pytest.mark.parametrize(
    ("source", "dest", "dest_is_dir", "root"),
    [
        ("/home/me/src", "/tmp", True, "/tmp/src"),
        ("/home/me/src", "/tmp/new", False, "/tmp/new"),
        ("/tmp/tree/", "out", True, "out/tree"),
        ("/tmp/tree", "out", False, "out"),
        ("/", "out", True, "out"),
        ("/tmp/..", "/x", True, "/x"),
    ],
    ids=[
        "into-an-existing-dir",
        "as-a-new-dir",
        "trailing-slash-keeps-the-name",
        "absent-dest-is-the-copy",
        "root-has-no-name",
        "dotdot-has-no-name",
    ],
)
def test_the_copy_lands_in_an_existing_directory_under_its_name_else_as_the_destination(
    source: str, dest: str, dest_is_dir: bool, root: str
) -> None:
    assert copy_root(source, dest, dest_is_dir) == root


def test_mkdir_asks_create_on_sandboxes_files_and_travels_to_the_agent() -> None:
    request = StreamRequest(FILES, "team", "box", op=MKDIR, path="/tmp/a dir")
    assert request.verb == "create"
    assert parse_api_request(api_path(request)) == request
    assert parse_agent_request(*agent_request(request)) == request


def test_the_local_walk_never_follows_a_link(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "f").write_bytes(b"x")
    (tmp_path / "to-etc").symlink_to("/etc")
    (tmp_path / "to-file").symlink_to(tmp_path / "sub" / "f")
    plan = walk_tree(str(tmp_path), local_lister(str(tmp_path)))
    assert plan.dirs == (("sub",),)
    assert plan.files == (("sub", "f"),)
    assert plan.skipped == ((("to-etc",), SYMLINK), (("to-file",), SYMLINK))


def test_an_unreadable_local_directory_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TreeRefused, match=f"{tmp_path}/gone: "):
        walk_tree(str(tmp_path / "gone"), local_lister(str(tmp_path / "gone")))
