"""One WebSocket library: ``websockets`` serves the agent's and the gateway's streams
and opens every client's (the gateway's relay, the CLI, the SDK). A second one
(``websocket-client``, imported as ``websocket``) would bring its own handshake,
TLS options, proxy rules and errors to keep apart."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TREES = ["operator/sandlot", "tests", "e2e", "bench"]
OTHER = "websocket"  # the websocket-client package's module


def imported_roots(source: str) -> set[str]:
    """The top-level names of what ``source`` imports."""
    roots = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize(
    ("source", "other"),
    [
        ("import websocket", True),
        ("from websocket import create_connection", True),
        ("import websocket._abnf as abnf", True),
        ("def f():\n    import websocket\n", True),
        ("from websockets.sync.client import connect", False),
        ("import websockets", False),
        ("from .websocket import x", False),
    ],
    ids=[
        "import",
        "from",
        "submodule",
        "inside_a_function",
        "websockets",
        "websockets_bare",
        "relative",
    ],
)
def test_the_check_finds_the_other_library_and_only_that(source: str, other: bool) -> None:
    assert (OTHER in imported_roots(source)) is other


def test_no_module_imports_websocket_client() -> None:
    modules = [
        p
        for tree in TREES
        for p in (ROOT / tree).rglob("*.py")
        if "gen" not in p.relative_to(ROOT).parts
    ]
    assert ROOT / "operator/sandlot/adapters/streamclient.py" in modules
    found = sorted(
        p.relative_to(ROOT).as_posix() for p in modules if OTHER in imported_roots(p.read_text())
    )
    assert not found, f"open WebSockets with websockets (websockets.sync.client): {found}"


def test_pyproject_names_one_websocket_library() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    named = [
        d.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().lower()
        for d in project["dependencies"]
    ]
    assert "websockets" in named
    assert "websocket-client" not in named
