"""One vocabulary: the condition types and reasons sandlot writes are named once,
as enum members in ``sandlot.api.reasons``, and the code says the name, not the word.

Two checks over the package's syntax trees (outside ``sandlot.api``, whose CRD
rules speak Kubernetes' own validation words):

- a string literal equal to a word of the vocabulary (a copy of a member: it
  drifts when the member changes, and hides the place from a search for the name);
- a string literal written as a reason (``"reason": "X"``, ``reason="X"``,
  ``x.get("reason") == "X"``) whatever its word (a reason the vocabulary lacks).

Docstrings, f-string pieces, ``__all__`` and the members of other enums (their own
names, such as ``SandboxPhase.SCHEDULED``) are not literals in that sense. Words of
another vocabulary that happen to be the same are listed with why.
"""

from __future__ import annotations

import ast
from enum import StrEnum
from pathlib import Path

import pytest

from sandlot.api import reasons

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "sandlot"
REASON_KEYS = frozenset({"reason"})

# (module, word): why the literal is not a copy of sandlot's word.
OTHER_VOCABULARIES: dict[tuple[str, str], str] = {
    ("sandlot/devtools/cluster/__init__.py", "Ready"): "a Kubernetes Node's own condition",
}


def vocabulary() -> frozenset[str]:
    enums = [e for e in vars(reasons).values() if isinstance(e, type) and issubclass(e, StrEnum)]
    return frozenset(m.value for e in enums for m in e)


def _not_literals(tree: ast.AST) -> set[int]:
    """ids of string constants that are no literal use: docstrings and bare string
    statements, f-string pieces, ``__all__``, and enum members' own values."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            skip.update(id(n) for n in ast.walk(node.value))
        elif isinstance(node, ast.ClassDef) and any(
            ast.unparse(b).endswith("Enum") for b in node.bases
        ):
            skip.update(id(s.value) for s in node.body if isinstance(s, ast.Assign))
    return skip


def _is_reason_key(node: ast.expr) -> bool:
    """``x["reason"]`` or ``x.get("reason")``."""
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr != "get" or not node.args:
            return False
        key = node.args[0]
    else:
        return False
    return isinstance(key, ast.Constant) and key.value in REASON_KEYS


def _written_as_reason(tree: ast.AST) -> list[ast.Constant]:
    """String literals in a reason's place."""
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            found += [
                v
                for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value in REASON_KEYS
            ]
        elif isinstance(node, ast.keyword) and node.arg in REASON_KEYS:
            found.append(node.value)
        elif isinstance(node, ast.Compare) and _is_reason_key(node.left):
            found += node.comparators
    return [n for n in found if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def stray_words(source: str, words: frozenset[str]) -> list[tuple[int, str]]:
    """(line, word) of every literal copy of a vocabulary word or reason in ``source``."""
    tree = ast.parse(source)
    skip = _not_literals(tree)
    strays = {
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in words and id(n) not in skip
    }
    strays |= {(n.lineno, str(n.value)) for n in _written_as_reason(tree) if n.value}
    return sorted(strays)


def package_strays() -> dict[tuple[str, str], list[int]]:
    words = vocabulary()
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(ROOT / "operator").as_posix()
        if module.startswith("sandlot/api/") or "gen" in path.relative_to(PACKAGE).parts:
            continue
        for line, word in stray_words(path.read_text(), words):
            found.setdefault((module, word), []).append(line)
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('status = {"phase": "Failed", "reason": "Pulling"}', [(1, "Pulling")]),
        ('raise StartFailed("InvalidSpec", message)', [(1, "InvalidSpec")]),
        ('REASON_SOMETHING = "NodeLost"', [(1, "NodeLost")]),
        ('if c.get("type") == "Ready":\n    pass', [(1, "Ready")]),
        ('Condition(type=t, status="False", reason="NotInTheEnums")', [(1, "NotInTheEnums")]),
        ('if status["reason"] == "AlsoNew":\n    pass', [(1, "AlsoNew")]),
        ('post(body, "Warning", EventReason.BACK_OFF, "backing off")', []),
        ('"""Reason ``Pulling`` while the image comes."""', []),
        ('message = f"{name} is Ready"', []),
        ('__all__ = ["Evicted"]', []),
        ('class Phase(StrEnum):\n    SCHEDULED = "Scheduled"', []),
        ('{"reason": reason, "type": "RLIMIT_NOFILE"}', []),
    ],
    ids=[
        "status-dict",
        "positional-argument",
        "module-constant",
        "condition-type",
        "reason-keyword-any-word",
        "reason-comparison-any-word",
        "member-named",
        "docstring",
        "f-string-piece",
        "dunder-all",
        "other-enum-member",
        "not-a-reason",
    ],
)
def test_stray_words_finds_literal_copies_and_only_them(
    source: str, expected: list[tuple[int, str]]
) -> None:
    assert stray_words(source, vocabulary()) == expected


def test_every_reason_and_condition_type_is_named_not_spelled_outside_the_api() -> None:
    strays = package_strays()
    unexplained = {k: v for k, v in strays.items() if k not in OTHER_VOCABULARIES}
    assert not unexplained, (
        "name the member of sandlot.api.reasons (add one if the word is new) instead of "
        f"the literal: {unexplained}"
    )


def test_every_listed_other_vocabulary_word_is_still_there() -> None:
    stale = set(OTHER_VOCABULARIES) - set(package_strays())
    assert not stale, f"no longer in the code, drop from OTHER_VOCABULARIES: {stale}"


def test_no_word_has_two_names_in_one_enum() -> None:
    enums = [e for e in vars(reasons).values() if isinstance(e, type) and issubclass(e, StrEnum)]
    aliases = {e.__name__: set(e.__members__) - {m.name for m in e} for e in enums}
    assert not any(aliases.values()), aliases
