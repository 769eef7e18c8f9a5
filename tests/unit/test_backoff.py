"""One capped doubling: ``sandlot.policy.backoff.capped_doubling`` is the wait of
every retry that doubles, and no other module doubles a wait by hand (each copy
chose its own edge: a zero count, an overflowing exponent, a cap below the start)."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest

from sandlot.policy.backoff import capped_doubling

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "sandlot"
HOME = PACKAGE / "policy" / "backoff.py"

# The modules whose retries double: each waits by the one function.
USERS = [
    "agent/bringup.py",
    "adapters/informer.py",
    "controllers/workqueue.py",
    "policy/pools.py",
    "policy/suspension.py",
    "policy/pulling/decision.py",
    "policy/statedeletion.py",
    "policy/writebackoff.py",
]

S = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("failures", "first", "cap", "wait"),
    [
        (1, 0.5, 30.0, 0.5),
        (2, 0.5, 30.0, 1.0),
        (3, 0.5, 30.0, 2.0),
        (7, 0.5, 30.0, 30.0),
        (0, 1.0, 60.0, 1.0),
        (-3, 1.0, 60.0, 1.0),
        (1, 5 * S, 300 * S, 5 * S),
        (4, 5 * S, 300 * S, 40 * S),
        (6, 5 * S, 300 * S, 160 * S),
        (7, 5 * S, 300 * S, 300 * S),
        (10_000, 10 * S, 300 * S, 300 * S),
        (10_000, 0.5, 10.0, 10.0),
        (1, 10 * S, 5 * S, 5 * S),
    ],
    ids=[
        "first-failure-waits-first",
        "second-doubles",
        "third-doubles-again",
        "capped",
        "no-failure-yet-waits-first",
        "a-negative-count-waits-first",
        "timedelta-first",
        "timedelta-doubles",
        "timedelta-below-cap",
        "timedelta-capped",
        "a-huge-count-never-overflows-timedelta",
        "a-huge-count-never-overflows-float",
        "a-cap-below-the-first-wait-wins",
    ],
)
def test_capped_doubling(
    failures: int, first: float | timedelta, cap: float | timedelta, wait: float | timedelta
) -> None:
    assert capped_doubling(failures, first, cap) == wait  # type: ignore[type-var]


DELAY_WORDS = ("backoff", "delay", "wait", "retry", "retries", "interval")


def _names_a_delay(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    return any(w in name.lower() for w in DELAY_WORDS)


def _two(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value in (2, 2.0)


def hand_doubling(source: str) -> list[int]:
    """Lines of ``source`` that double a wait by hand: ``2 ** n`` with a varying
    exponent, or a delay-named value times 2 (``delay * 2``, ``delay *= 2``)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            doubled = _two(node.left) and not isinstance(node.right, ast.Constant)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            doubled = (_two(node.right) and _names_a_delay(node.left)) or (
                _two(node.left) and _names_a_delay(node.right)
            )
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Mult):
            doubled = _two(node.value) and _names_a_delay(node.target)
        else:
            continue
        if doubled:
            lines.append(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("d = min(FIRST * 2 ** (n - 1), CAP)", True),
        ("d = min(start * 2.0 ** max(n - 1, 0), cap)", True),
        ("self.delay = min(self.delay * 2, CAP)", True),
        ("backoff = min(backoff * 2, MAX)", True),
        ("wait *= 2", True),
        ("d = 2 * retry_after", True),
        ("MAX_BYTES = 4 * 2**20", False),
        ("t.join(CLOSE_TIMEOUT * 2)", False),
        ("d = capped_doubling(n, FIRST, CAP)", False),
    ],
    ids=[
        "power-of-a-count",
        "float-power",
        "attribute-doubled",
        "name-doubled",
        "augmented",
        "two-times-a-retry",
        "constant-size",
        "a-timeout-not-a-retry",
        "the-function",
    ],
)
def test_the_check_finds_hand_doubling_and_only_that(source: str, found: bool) -> None:
    assert bool(hand_doubling(source)) is found


def test_no_module_doubles_a_wait_by_hand() -> None:
    modules = [p for p in PACKAGE.rglob("*.py") if "gen" not in p.relative_to(PACKAGE).parts]
    assert HOME in modules
    found = {
        p.relative_to(PACKAGE).as_posix(): lines
        for p in modules
        if p != HOME and (lines := hand_doubling(p.read_text()))
    }
    assert not found, f"wait by sandlot.policy.backoff.capped_doubling: {found}"


@pytest.mark.parametrize("module", USERS)
def test_every_doubling_retry_waits_by_the_one_function(module: str) -> None:
    tree = ast.parse((PACKAGE / module).read_text())
    imported = {
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "sandlot.policy.backoff"
        for a in n.names
    }
    called = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert "capped_doubling" in imported & called, module
