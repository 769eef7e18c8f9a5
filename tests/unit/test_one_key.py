"""One key of an object: ``sandlot.api.common.key_of`` says "namespace/name", and no
other place spells that key out of an object's metadata (a copy drifts: a missing
namespace, a different separator). A key built from a namespace and a name held
apart (a record's, a snapshot's ``sandboxName``, a referenced object's) is
``join_key``'s, and a key is taken apart by ``split_key`` alone, never by
``.split("/", 1)``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from sandlot.api.common import join_key, key_of, split_key

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


def _reads_namespace(node: ast.expr) -> bool:
    return isinstance(node, ast.FormattedValue) and "namespace" in ast.unparse(node.value)


def hand_built_keys(source: str) -> list[int]:
    """Lines of ``source`` that build or take apart a ``namespace/name`` key by hand:
    an f-string that is nothing but ``{namespace}/{name}``, one joining a namespace
    to a ``sandboxName``, or ``.split("/", 1)``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            whole_key = (
                len(parts) == 3
                and _reads_namespace(parts[0])
                and isinstance(parts[1], ast.Constant)
                and parts[1].value == "/"
            )
            to_sandbox = any(
                _reads_namespace(a)
                and isinstance(b, ast.Constant)
                and str(b.value).startswith("/")
                and isinstance(c, ast.FormattedValue)
                and "sandboxName" in ast.unparse(c.value)
                for a, b, c in zip(parts, parts[1:], parts[2:], strict=False)
            )
            if whole_key or to_sandbox:
                lines.append(node.lineno)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "split"
            and [ast.unparse(a) for a in node.args] == ["'/'", "1"]
        ):
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("""key = f"{rec.namespace}/{rec.claim}\"""", True),
        ("""key = f"{meta['namespace']}/{spec.get('sandboxName')}\"""", True),
        ("""m = f"sandbox {meta['namespace']}/{spec['sandboxName']} is gone\"""", True),
        ("""ref = f"{sb['metadata']['namespace']}/{snapshot_ref(spec)}\"""", True),
        ("""get(*key.split("/", 1))""", True),
        ("""ns, name = labels[SANDBOX_LABEL].split("/", 1)""", True),
        ("""m = f"cannot read sandbox {namespace}/{name}\"""", False),
        ("""path = f"/sandboxes/{r.namespace}/{r.name}/{r.kind}\"""", False),
        ("""host = key.partition("/")[0]""", False),
        ("""shim = name.rsplit("/", 1)[-1]""", False),
        ("""key = join_key(rec.namespace, rec.claim)""", False),
        ("""ns, name = split_key(key)""", False),
    ],
    ids=[
        "record-key",
        "snapshot-sandbox-key",
        "snapshot-sandbox-key-in-a-message",
        "referenced-object-key",
        "split-of-a-key",
        "split-of-a-label",
        "key-in-a-message",
        "a-path",
        "a-host",
        "a-last-path-part",
        "join-helper",
        "split-helper",
    ],
)
def test_the_check_finds_a_hand_built_key_and_only_that(source: str, found: bool) -> None:
    assert bool(hand_built_keys(source)) is found


def test_only_the_key_helpers_build_and_split_keys() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if "gen" not in p.relative_to(PACKAGE).parts]
    found = {
        p.relative_to(PACKAGE).as_posix(): lines
        for p in modules
        if p != HOME and (lines := hand_built_keys(p.read_text()))
    }
    assert not found, (
        f"build a key with sandlot.api.common.join_key, take it apart with split_key: {found}"
    )


@pytest.mark.parametrize(
    "key", ["ns/name", "ns/a.b-c", "default/x"], ids=["plain", "dotted", "default"]
)
def test_split_key_inverts_key_of_and_join_key(key: str) -> None:
    namespace, name = split_key(key)
    assert join_key(namespace, name) == key
    assert key_of({"metadata": {"namespace": namespace, "name": name}}) == key


def test_split_key_refuses_a_key_without_a_namespace() -> None:
    with pytest.raises(ValueError, match="namespace/name"):
        split_key("cluster-scoped")
