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
        elif isinstance(node, ast.Call | ast.Subscript | ast.Assign) and _splits_a_key(node):
            lines.append(node.lineno)
    return sorted(lines)


def _at_slash(node: ast.AST, *methods: str) -> ast.expr | None:
    """The receiver of ``x.method("/")`` for one of ``methods``, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in methods
        and [ast.unparse(a) for a in node.args] == ["'/'"]
    ):
        return node.func.value
    return None


def _key_like(node: ast.expr) -> bool:
    """A value that holds a key: a name or attribute saying ``key``, or a sandbox label."""
    text = ast.unparse(node)
    return "SANDBOX_LABEL" in text or any(
        part.lower().endswith("key") for part in re.split(r"\W+", text) if part
    )


def _splits_a_key(node: ast.AST) -> bool:
    """A key taken apart at its slash: ``.split("/", 1)`` of anything, its name part
    taken from a partition (``key.rpartition("/")[2]``), a partition unpacked into a
    namespace and a name (``ns, _, name = label.partition("/")``), or a key split at
    every slash (``key.split("/")``). A registry key's host (``key.partition("/")[0]``)
    and a path's parts are not keys of objects."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "split"
        and [ast.unparse(a) for a in node.args] == ["'/'", "1"]
    ):
        return True
    if isinstance(node, ast.Subscript):
        receiver = _at_slash(node.value, "partition", "rpartition")
        return (
            receiver is not None and _key_like(receiver) and ast.unparse(node.slice) in ("2", "-1")
        )
    if isinstance(node, ast.Assign) and _at_slash(node.value, "partition", "rpartition"):
        target = node.targets[0]
        return (
            isinstance(target, ast.Tuple)
            and isinstance(target.elts[0], ast.Name)
            and target.elts[0].id in ("ns", "namespace")
        )
    receiver = _at_slash(node, "split", "rsplit")
    return receiver is not None and _key_like(receiver)


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
        ("""names = {key.rpartition("/")[2] for key in keys}""", True),
        ("""ns, _, name = labels.get(SANDBOX_LABEL, "").partition("/")""", True),
        ("""namespace, _, name = ref.partition("/")""", True),
        ("""ns, name = key.split("/")""", True),
        ("""parts = self._key.rsplit("/")""", True),
        ("""parent, _, name = inside.rpartition("/")""", False),
        ("""host, _, rest = image.partition("/")""", False),
        ("""parts = url.path.split("/")""", False),
        ("""base = address.partition("/")[0]""", False),
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
        "name-part-of-a-partition",
        "label-partitioned-into-namespace-and-name",
        "reference-partitioned-into-namespace-and-name",
        "key-split-at-every-slash",
        "key-attribute-rsplit",
        "a-path-partitioned",
        "an-image-partitioned",
        "a-url-path-split",
        "an-address-prefix",
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
