"""CI's ``SANDLOT_REQUIRE_REAL=1`` turns a skip into a failure, except for kind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SAMPLE = """
import pytest

def test_needs_containerd():
    pytest.skip("containerd is not installed")

@pytest.mark.kind
def test_needs_docker():
    pytest.skip("no Docker engine")

def test_runs():
    assert True
"""


def _run(tmp_path: Path, require: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "SANDLOT_REQUIRE_REAL"}
    env["PYTHONPATH"] = str(ROOT)
    if require is not None:
        env["SANDLOT_REQUIRE_REAL"] = require
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.strict_skips", "-q", "-rA",
         "-p", "no:cacheprovider", "-p", "no:randomly", str(tmp_path / "test_sample.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("require", "summary", "code"),
    [
        (None, "1 passed, 2 skipped", 0),
        ("0", "1 passed, 2 skipped", 0),
        ("1", "1 failed, 1 passed, 1 skipped", 1),
    ],
    ids=["unset-skips-stay-skips", "zero-skips-stay-skips", "set-a-skip-fails-kind-exempt"],
)
def test_require_real_turns_skips_into_failures_except_kind(
    tmp_path: Path, require: str | None, summary: str, code: int
):
    result = _run(tmp_path, require)
    assert summary in result.stdout, result.stdout + result.stderr
    assert result.returncode == code, result.stdout
    if code:
        assert "containerd is not installed" in result.stdout
        assert "SANDLOT_REQUIRE_REAL=1" in result.stdout


@pytest.mark.parametrize("has_apparmor", [False, True], ids=["kernel-without", "kernel-with"])
def test_an_apparmor_skip_is_exempt_only_where_the_kernel_has_none(
    monkeypatch: pytest.MonkeyPatch, has_apparmor: bool
) -> None:
    from tests.support import strict_skips

    monkeypatch.setattr(strict_skips, "kernel_has_apparmor", lambda: has_apparmor)

    class Marked:
        def get_closest_marker(self, name: str) -> object | None:
            return object() if name == "apparmor" else None

    assert strict_skips._exempt_item(Marked()) is (not has_apparmor)  # type: ignore[arg-type]
