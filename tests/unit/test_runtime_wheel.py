"""The runtime wheel (and so the image) carries no development tools, and a command
that needs them says so in one line where they are missing."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sandlot.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_takes_every_module_but_the_development_tools(tmp_path: Path) -> None:
    """The wheel pip builds from a copy of what the Dockerfile copies (pyproject.toml,
    README.md, operator/), as its ``pip install .`` does."""
    tree = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(
        ROOT / "operator",
        tree / "operator",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(tmp_path / "out"), str(tree)],
        check=True, capture_output=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = (tmp_path / "out").glob("sandlot-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    source = {
        p.relative_to(ROOT / "operator").as_posix()
        for p in (ROOT / "operator" / "sandlot").rglob("*.py")
        if "/containerd/gen/" not in p.as_posix()
    }
    dev = {n for n in source if n.startswith("sandlot/devtools/")}
    assert dev, "no development tools found to leave out"
    assert not {n for n in shipped if n.startswith("sandlot/devtools/")}, "devtools shipped"
    assert source - dev <= shipped, sorted(source - dev - shipped)[:10]


@pytest.mark.parametrize(
    "argv",
    [["demo"], ["dev", "up"], ["dev", "cluster", "up"], ["gen", "crds"]],
    ids=["demo", "dev-up", "dev-cluster-up", "gen"],
)
def test_a_command_that_needs_them_says_so_where_they_are_missing(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m.startswith("sandlot.devtools")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "sandlot.devtools", None)  # as if not installed
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"`sandlot {' '.join(argv)}` needs sandlot's development tools" in err, err
    assert "Traceback" not in err
