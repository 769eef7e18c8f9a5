"""Modules stay small and functions short, so each reads in one sitting.

Every module outside generated code has at most ``MAX_MODULE_LINES`` lines (as
``wc -l`` counts them); one past ``LOOK_AT_LINES`` is named in a warning, a
prompt to look whether it still holds one concern, not a wall that splits one
concern over several modules. A function longer than ``MAX_FUNCTION_LINES`` either is
split into named steps or says why it stays long: a comment starting with
``LONG_MARKER`` among its first ``MARKER_WITHIN`` lines, followed by the reason.
There is no exemption list: the reason lives beside the function it excuses.
"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "sandlot"

MAX_MODULE_LINES = 600
LOOK_AT_LINES = 450
MAX_FUNCTION_LINES = 80
LONG_MARKER = "# Long on purpose:"
MARKER_WITHIN = 20
# A reason is a phrase, not a token: at least this many words after the marker.
MIN_REASON_WORDS = 4


def source_modules() -> list[Path]:
    """Every Python module of the package except generated code (``gen/``)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "gen" not in p.relative_to(PACKAGE).parts)


def relative(path: Path) -> str:
    return path.relative_to(ROOT / "operator").as_posix()


def line_count(text: str) -> int:
    """Lines as ``wc -l`` counts them (newline characters)."""
    return text.count("\n")


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length) of every function longer than ``limit``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > limit:
                        found.append((name, child.lineno, length))
                visit(child, f"{name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def reason_for_length(lines: list[str], first_line: int) -> str | None:
    """The reason a ``LONG_MARKER`` comment gives within the function's first lines."""
    for line in lines[first_line - 1 : first_line - 1 + MARKER_WITHIN]:
        stripped = line.strip()
        if stripped.startswith(LONG_MARKER):
            reason = stripped[len(LONG_MARKER) :].strip()
            return reason if len(reason.split()) >= MIN_REASON_WORDS else None
    return None


def unexplained_long_functions(source: str) -> list[tuple[str, int, int]]:
    lines = source.splitlines()
    return [f for f in long_functions(source) if reason_for_length(lines, f[1]) is None]


def test_no_module_is_over_the_size_limit():
    offenders, large = [], []
    for path in source_modules():
        lines = line_count(path.read_text())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{relative(path)} ({lines} lines)")
        elif lines > LOOK_AT_LINES:
            large.append(f"{relative(path)} ({lines} lines)")
    if large:
        warnings.warn(
            f"modules over {LOOK_AT_LINES} lines, worth a look (one concern each?): "
            + ", ".join(large),
            stacklevel=1,
        )
    assert not offenders, (
        f"modules over {MAX_MODULE_LINES} lines; split them by job: {', '.join(offenders)}"
    )


def test_every_long_function_says_why_it_stays_long():
    offenders = []
    for path in source_modules():
        for name, first, length in unexplained_long_functions(path.read_text()):
            offenders.append(f"{relative(path)}:{first} {name} ({length} lines)")
    assert not offenders, (
        f"functions over {MAX_FUNCTION_LINES} lines without a '{LONG_MARKER} <reason>' comment "
        f"in their first {MARKER_WITHIN} lines; split them into named steps or say why: "
        + ", ".join(offenders)
    )


def _function(body_lines: int, *, comment: str | None = None, at: int = 1) -> str:
    body = [f"    x = {i}" for i in range(body_lines)]
    if comment is not None:
        body.insert(at - 1, f"    {comment}")
    return "def recipe():\n" + "\n".join(body) + "\n"


@pytest.mark.parametrize(
    ("source", "unexplained"),
    [
        (_function(MAX_FUNCTION_LINES - 1), []),
        (_function(MAX_FUNCTION_LINES), ["recipe"]),
        (_function(200, comment=f"{LONG_MARKER} one linear recipe, step by step"), []),
        (_function(200, comment=f"{LONG_MARKER} because"), ["recipe"]),
        (_function(200, comment="# one linear recipe, step by step"), ["recipe"]),
        (
            _function(200, comment=f"{LONG_MARKER} one linear recipe, step by step", at=30),
            ["recipe"],
        ),
        (
            "class Outer:\n" + "".join("    " + line + "\n" for line in _function(90).splitlines()),
            ["Outer.recipe"],
        ),
    ],
    ids=[
        "short-enough",
        "one-line-too-long",
        "long-with-reason",
        "marker-without-a-reason",
        "comment-without-the-marker",
        "marker-too-far-down",
        "method-named-by-its-class",
    ],
)
def test_the_length_rule_reads_functions_as_intended(source, unexplained):
    assert [f[0] for f in unexplained_long_functions(source)] == unexplained


def test_the_size_rule_counts_lines_as_wc_does():
    assert line_count("a\nb\n") == 2
    assert line_count("a\nb") == 1


def test_generated_code_is_left_out_and_everything_else_is_in():
    seen = {relative(p) for p in source_modules()}
    assert {"sandlot/api/keys.py", "sandlot/adapters/cni/attachment.py"} <= seen
    generated = [s for s in seen if re.search(r"(^|/)gen/", s)]
    assert not generated, f"generated modules must be left out: {generated}"
