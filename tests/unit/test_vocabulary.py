"""One vocabulary: the condition types and reasons sandlot writes are named once,
as enum members in ``sandlot.api.reasons``, and the code says the name, not the word.

Two checks over the package's syntax trees (outside ``sandlot.api``, whose CRD
rules speak Kubernetes' own validation words):

- a string literal equal to a word of the vocabulary (a copy of a member: it
  drifts when the member changes, and hides the place from a search for the name);
- a string literal written as a reason or a phase (``"reason": "X"``,
  ``reason="X"``, ``x.get("phase") in (None, "X")``, ``phase != "X"``, or passed
  where a function of the package takes its ``reason`` parameter, as in
  ``status.end(obj, phase, "X", message)``) whatever its word (a reason the
  vocabulary lacks, a phase its enum in ``sandlot.api`` does not name).

Docstrings, f-string pieces, ``__all__`` and the members of other enums (their own
names, such as ``SandboxPhase.SCHEDULED``) are not literals in that sense. Words of
another vocabulary that happen to be the same are listed with why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from enum import StrEnum
from pathlib import Path

import pytest

from sandlot.api import reasons

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "sandlot"
REASON_KEYS = frozenset({"reason", "phase"})

# (module, word): why the literal is not a copy of sandlot's word.
OTHER_VOCABULARIES: dict[tuple[str, str], str] = {
    ("sandlot/devtools/cluster/__init__.py", "Ready"): "a Kubernetes Node's own condition",
    ("sandlot/adapters/agentpods.py", "Running"): "a Kubernetes Pod's own phase",
    ("sandlot/mcpserver/tools.py", "unexpected end of data"): "a UnicodeDecodeError's reason",
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
    """``x["reason"]``, ``x.get("reason")``, ``x.reason`` or ``reason`` (or phase)."""
    if isinstance(node, ast.Name):
        return node.id in REASON_KEYS
    if isinstance(node, ast.Attribute):
        return node.attr in REASON_KEYS
    if isinstance(node, ast.Subscript):
        key = node.slice
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        if node.func.attr != "get" or not node.args:
            return False
        key = node.args[0]
    else:
        return False
    return isinstance(key, ast.Constant) and key.value in REASON_KEYS


def reason_positions(sources: Iterable[str]) -> dict[str, int]:
    """Functions (by name) whose every definition in ``sources`` takes ``reason`` as
    the same positional parameter (``self`` not counted): its index."""
    seen: dict[str, set[int | None]] = {}
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                names = [a.arg for a in node.args.posonlyargs + node.args.args]
                if names and names[0] in ("self", "cls"):
                    names = names[1:]
                at = names.index("reason") if "reason" in names else None
                seen.setdefault(node.name, set()).add(at)
    return {
        f: at for f, ats in seen.items() if len(ats) == 1 and (at := next(iter(ats))) is not None
    }


def _written_as_reason(tree: ast.AST, positions: Mapping[str, int]) -> list[ast.Constant]:
    """String literals in a reason's (or a phase's) place."""
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
            for c in node.comparators:
                found += c.elts if isinstance(c, ast.Tuple | ast.List | ast.Set) else [c]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            at = positions.get(name)
            if at is not None and at < len(node.args):
                found.append(node.args[at])
    return [n for n in found if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def stray_words(
    source: str, words: frozenset[str], positions: Mapping[str, int] | None = None
) -> list[tuple[int, str]]:
    """(line, word) of every literal copy of a vocabulary word or reason in ``source``."""
    tree = ast.parse(source)
    skip = _not_literals(tree)
    strays = {
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and n.value in words and id(n) not in skip
    }
    if positions is None:
        positions = reason_positions([source])
    strays |= {(n.lineno, str(n.value)) for n in _written_as_reason(tree, positions) if n.value}
    return sorted(strays)


def package_strays() -> dict[tuple[str, str], list[int]]:
    words = vocabulary()
    found: dict[tuple[str, str], list[int]] = {}
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if "gen" not in p.relative_to(PACKAGE).parts]
    positions = reason_positions(p.read_text() for p in paths)
    for path in paths:
        module = path.relative_to(ROOT / "operator").as_posix()
        if module.startswith("sandlot/api/"):
            continue
        for line, word in stray_words(path.read_text(), words, positions):
            found.setdefault((module, word), []).append(line)
    return found


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ('status = {"phase": "Failed", "reason": "Pulling"}', [(1, "Failed"), (1, "Pulling")]),
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
        (
            "def end(self, obj, phase, reason, message): ...\n"
            'status.end(obj, SandboxPhase.STOPPED, "Gone", "it went")',
            [(2, "Gone")],
        ),
        ('def end(obj, phase, reason): ...\nend(obj, "Stopped", SandboxReason.DRAINED)', []),
        ('if claim.status.get("phase") in (None, "Pending"):\n    pass', [(1, "Pending")]),
        ('if phase != "Running":\n    pass', [(1, "Running")]),
        ("if sb.phase == SandboxPhase.RUNNING:\n    pass", []),
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
        "positional-reason-argument",
        "positional-argument-not-the-reason",
        "phase-in-a-tuple",
        "phase-name-compared",
        "phase-member",
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
        "name the member of sandlot.api.reasons or of the phase enum in sandlot.api (add one "
        "if the word is new) instead of "
        f"the literal: {unexplained}"
    )


def test_every_listed_other_vocabulary_word_is_still_there() -> None:
    stale = set(OTHER_VOCABULARIES) - set(package_strays())
    assert not stale, f"no longer in the code, drop from OTHER_VOCABULARIES: {stale}"


def test_no_word_has_two_names_in_one_enum() -> None:
    enums = [e for e in vars(reasons).values() if isinstance(e, type) and issubclass(e, StrEnum)]
    aliases = {e.__name__: set(e.__members__) - {m.name for m in e} for e in enums}
    assert not any(aliases.values()), aliases
