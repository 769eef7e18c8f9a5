"""The docs name only code that exists: every module path (``sandlot/agent/sync.py``,
``agent/sync.py``, ``tests/unit/...py``), package directory (``sandlot/gateway/``)
and dotted name (``sandlot.policy.pulling``, ``sandlot.client.Sandbox``) in
``docs/*.md`` and the README is looked up in the tree, so a move or a rename that
forgets the docs fails here instead of leaving them wrong."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "operator" / "sandlot"
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
LAYERS = "api|policy|adapters|controllers|agent|gateway|client|cli|devtools|mcpserver"
TOPS = "tests|bench|e2e|scripts|operator"

PATH = re.compile(rf"(?<![\w./-])((?:sandlot/|{LAYERS}/|{TOPS}/)[\w/.-]*?\w\.py)\b")
DIRECTORY = re.compile(r"(?<![\w./-])(sandlot/[\w/]+/)(?![\w.])")
DOTTED = re.compile(r"`(sandlot(?:\.\w+)+)`")


def _file(path: str) -> Path:
    if path.startswith("sandlot/"):
        return ROOT / "operator" / path
    if re.match(rf"({TOPS})/", path):
        return ROOT / path
    return PACKAGE / path


def _dotted_exists(name: str) -> bool:
    """``sandlot.a.b`` is a module or package, or names something a module defines."""
    parts = name.split(".")[1:]
    where = PACKAGE
    for i, part in enumerate(parts):
        if (where / part).is_dir():
            where = where / part
            continue
        if (where / f"{part}.py").is_file():
            source = (where / f"{part}.py").read_text()
            rest = parts[i + 1 :]
        else:  # an attribute of the package's face, or nothing
            init = where / "__init__.py"
            source, rest = (init.read_text() if init.is_file() else ""), parts[i:]
        if not rest:
            return True
        return re.search(rf"^\s*(class |def |async def )?{rest[0]}\b", source, re.M) is not None
    return True


def _mentions(doc: Path) -> list[tuple[str, bool]]:
    text = doc.read_text()
    found = [(p, _file(p).is_file()) for p in PATH.findall(text)]
    found += [(d, (ROOT / "operator" / d).is_dir()) for d in DIRECTORY.findall(text)]
    found += [(n, _dotted_exists(n)) for n in DOTTED.findall(text) if n != "sandlot.dev"]
    return found


@pytest.mark.parametrize("doc", DOCS, ids=[d.name for d in DOCS])
def test_every_module_a_doc_names_exists(doc: Path) -> None:
    missing = sorted({name for name, exists in _mentions(doc) if not exists})
    assert not missing, f"{doc.name} names code that does not exist: {missing}"


def test_the_check_finds_the_names_it_should() -> None:
    # The architecture doc names dozens of modules in every form the patterns read.
    names = {name for name, _ in _mentions(ROOT / "docs" / "architecture.md")}
    assert "sandlot/agent/sync.py" in names
    assert any(n.startswith("sandlot.") for n in names)
    assert len(names) > 50, names
    assert not _dotted_exists("sandlot.policy.no_such_module")
    assert not _dotted_exists("sandlot.policy.pulling.NoSuchName")
    assert _dotted_exists("sandlot.policy.pulling.decide_pull")
    assert not _file("sandlot/agent/no_such.py").is_file()
