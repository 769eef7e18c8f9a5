"""Each program imports only what it runs: the agent on a node never loads the
operator's controllers or the development tools, the operator never loads the
agent. Checked in a fresh interpreter, where ``sys.modules`` starts empty."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import textwrap

import pytest

from sandlot.cli.main import COMMANDS, build_parser, command_in
from tests.support.kube import repo_root

PROBE = """
import contextlib, io, json, sys
from sandlot.cli.main import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main({argv!r})
    except SystemExit:
        pass
for module in {imports!r}:
    __import__(module)
print(json.dumps(sorted(m for m in sys.modules if m.startswith("sandlot"))))
"""


def loaded_after(argv: list[str], imports: list[str]) -> list[str]:
    """The sandlot modules a fresh interpreter holds after ``sandlot ARGV`` and ``imports``."""
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(argv=argv, imports=imports)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout.splitlines()[-1]))


def under(modules: list[str], *packages: str) -> list[str]:
    return [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]


@pytest.mark.parametrize(
    ("argv", "imports", "command_module", "never"),
    [
        (
            ["agent", "--help"],
            [],
            "sandlot.cli.agent_cmd",
            ("sandlot.devtools", "sandlot.controllers"),
        ),
        (
            ["agent", "--help"],
            ["sandlot.agent.main"],
            "sandlot.cli.agent_cmd",
            ("sandlot.devtools", "sandlot.controllers"),
        ),
        (
            ["operator", "--help"],
            [],
            "sandlot.cli.operator_cmd",
            ("sandlot.devtools", "sandlot.agent"),
        ),
        (
            ["operator", "--help"],
            ["sandlot.controllers.operator"],
            "sandlot.cli.operator_cmd",
            ("sandlot.devtools", "sandlot.agent"),
        ),
    ],
    ids=[
        "agent_help",
        "agent_with_its_run_path",
        "operator_help",
        "operator_with_its_run_path",
    ],
)
def test_a_program_loads_neither_the_other_nor_the_devtools(
    argv: list[str], imports: list[str], command_module: str, never: tuple[str, ...]
) -> None:
    loaded = loaded_after(argv, imports)
    assert command_module in loaded, loaded  # the probe really ran the command
    assert under(loaded, *never) == [], f"sandlot {' '.join(argv)} loaded {under(loaded, *never)}"


def test_the_full_help_registers_exactly_the_listed_commands() -> None:
    parser = build_parser(["--help"])
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(actions[0].choices) == set(COMMANDS)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["agent", "--node", "n1"], "agent"),
        (["-v", "operator"], "operator"),
        (["--help"], None),
        ([], None),
    ],
    ids=["command_first", "after_a_top_level_flag", "help_only", "nothing"],
)
def test_the_command_is_the_first_word_that_is_not_an_option(
    argv: list[str], expected: str | None
) -> None:
    assert command_in(argv) == expected


def test_the_cli_imports_the_devtools_only_inside_its_commands() -> None:
    eager = []
    for path in sorted((repo_root() / "operator" / "sandlot" / "cli").glob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            eager += [f"{path.name}: {n}" for n in names if n.startswith("sandlot.devtools")]
    assert eager == [], textwrap.shorten(f"module-level devtools imports: {eager}", 400)
