"""An exec's process is the sandbox's own, with only its arguments and terminal replaced."""

from __future__ import annotations

import pytest

from sandlot.adapters.containerd.execs import exec_process_spec

CONTAINER = {
    "process": {
        "args": ["sleep", "1000"],
        "env": ["PATH=/bin"],
        "cwd": "/work",
        "user": {"uid": 1000, "gid": 1000},
        "capabilities": {"bounding": ["CAP_KILL"]},
        "noNewPrivileges": True,
        "terminal": False,
        "consoleSize": {"height": 10, "width": 10},
    }
}


@pytest.mark.parametrize(
    ("tty", "env"),
    [(False, ["PATH=/bin"]), (True, ["PATH=/bin", "TERM=xterm"])],
    ids=["plain", "terminal-gets-a-TERM"],
)
def test_an_exec_keeps_the_sandboxes_user_caps_and_directory(tty: bool, env: list[str]) -> None:
    process = exec_process_spec(CONTAINER, ["ls", "-l"], tty)
    assert process["args"] == ["ls", "-l"]
    assert process["terminal"] is tty
    assert process["env"] == env
    assert (process["user"], process["cwd"], process["capabilities"]) == (
        {"uid": 1000, "gid": 1000},
        "/work",
        {"bounding": ["CAP_KILL"]},
    )
    assert process["noNewPrivileges"] is True
    assert "consoleSize" not in process
    assert CONTAINER["process"]["args"] == ["sleep", "1000"]  # the container's spec is untouched


def test_a_terminal_keeps_a_term_the_sandbox_set() -> None:
    spec = {"process": {"env": ["TERM=vt100"]}}
    assert exec_process_spec(spec, ["sh"], True)["env"] == ["TERM=vt100"]


def test_a_bare_exec_has_no_capabilities_and_no_new_privileges_but_the_sandboxes_user() -> None:
    container = {"process": {**CONTAINER["process"], "noNewPrivileges": False}}
    process = exec_process_spec(container, ["/dev/.sandlot/files", "stat", "/"], False, bare=True)
    assert process["capabilities"] == {
        "bounding": [],
        "effective": [],
        "inheritable": [],
        "permitted": [],
        "ambient": [],
    }
    assert process["noNewPrivileges"] is True
    assert (process["user"], process["env"], process["cwd"]) == (
        {"uid": 1000, "gid": 1000},
        ["PATH=/bin"],
        "/work",
    )
