"""``sandlot`` turns the user's bad input into one line and exit 2, and nothing
else: an unexpected error, a ``ValueError`` from a library included, keeps its
traceback so it can be diagnosed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandlot.api.errors import UsageError
from sandlot.cli.main import main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["purge"], "say what to purge: --workloads, --nodes, or both"),
        (["purge", "--nodes"], "purge deletes every SandboxNode in the cluster; add --yes"),
        (
            ["operator", "--grace-period", "soon"],
            "invalid settings: --grace-period / SANDLOT_GRACE_PERIOD",
        ),
        (["agent", "--node", "n1", "--kill-wait", "-"], "invalid settings: --kill-wait"),
    ],
    ids=[
        "purge_without_a_target",
        "purge_without_yes",
        "operator_setting_refused_by_its_model",
        "agent_setting_refused_by_its_model",
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sandlot: error: {message}"), err
    assert len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv",
    [
        ["drain", "n1", "--timeout", "soon"],
        ["purge", "--nodes", "--yes", "--wait", "soon"],
        ["cache", "clear", "containerd", "--timeout", "soon"],
    ],
    ids=["drain_timeout", "purge_wait", "cache_clear_timeout"],
)
def test_a_bad_duration_flag_is_refused_while_parsing(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "'soon' is not a duration" in capsys.readouterr().err


def test_an_unreadable_kubeconfig_is_an_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("apiVersion: v1\nclusters: [this is: not valid\n")
    assert main(["status", "--kubeconfig", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sandlot: error: cannot load Kubernetes configuration from {bad}")
    assert "Traceback" not in err, err  # the YAML parser's own message may span lines


def test_the_projects_input_errors_are_usage_errors_and_nothing_else_is() -> None:
    from sandlot.adapters.kube import ConfigError
    from sandlot.cli.options import SettingsError

    assert issubclass(SettingsError, UsageError)
    assert issubclass(ConfigError, UsageError)
    assert not issubclass(UsageError, ValueError), "a library's ValueError is not bad input"


def unparsable_server_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig whose server URL the HTTP stack refuses with a ValueError."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        "clusters: [{name: c, cluster: {server: 'http://[not-an-address'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return path


def test_a_value_error_from_deep_inside_is_not_swallowed(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="IPv6"):
        main(["status", "--kubeconfig", str(unparsable_server_kubeconfig(tmp_path))])


def test_a_value_error_from_deep_inside_shows_its_traceback(tmp_path: Path) -> None:
    kubeconfig = unparsable_server_kubeconfig(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "sandlot.cli.main", "status", "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("ValueError"), proc.stderr
    assert "sandlot: error:" not in proc.stderr
