"""One key of an object: ``sandlot.api.common.key_of`` says "namespace/name", and no
other place spells that key out of an object's metadata (a copy drifts: a missing
namespace, a different separator). Keys of something else that share the namespace
(a snapshot's, a referenced object's) are not this key and are left alone."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "sandlot"
HOME = PACKAGE / "api" / "common.py"

# An f-string piece reading an object's namespace, a slash, then the same kind of
# read of its name: f"{sb['metadata']['namespace']}/{sb['metadata']['name']}",
# f"{meta.get('namespace')}/{meta.get('name')}".
_READ = r"""(?:\[['"]{field}['"]\]|\.get\(['"]{field}['"][^)]*\))"""
SPELLED = re.compile(
    r"\{[^{}]*" + _READ.format(field="namespace") + r"[^{}]*\}/\{[^{}]*"
    + _READ.format(field="name") + r"[^{}]*\}"
)  # fmt: skip


def spelled_keys(source: str) -> list[int]:
    """Lines of ``source`` that spell an object's key instead of calling ``key_of``."""
    return [n for n, line in enumerate(source.splitlines(), 1) if SPELLED.search(line)]


@pytest.mark.parametrize(
    ("line", "spelled"),
    [
        ("""key = f"{sb['metadata']['namespace']}/{sb['metadata']['name']}\"""", True),
        ("""key = f"{meta.get('namespace')}/{meta.get('name', '')}\"""", True),
        ("""key = f"{body["metadata"]["namespace"]}/{body["metadata"]["name"]}\"""", True),
        ("""ref = f"{sb['metadata']['namespace']}/{snapshot_ref(spec)}\"""", False),
        ("""key = key_of(sb)""", False),
    ],
    ids=["subscripts", "gets", "double_quotes", "another_objects_key", "the_helper"],
)
def test_the_check_finds_a_spelled_key_and_only_that(line: str, spelled: bool) -> None:
    assert bool(spelled_keys(line)) is spelled


def test_only_key_of_spells_an_objects_key() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if "gen" not in p.relative_to(PACKAGE).parts]
    assert HOME in modules
    found = {
        p.relative_to(PACKAGE).as_posix(): lines
        for p in modules
        if p != HOME and (lines := spelled_keys(p.read_text()))
    }
    assert not found, f"spell the key with sandlot.api.common.key_of: {found}"
