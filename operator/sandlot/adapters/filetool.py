"""The files tool and the executor on the node: the agent's copies of
``operator/filetool``'s and ``operator/executor``'s static binaries, placed where
runc (which runs on the node, not in the agent's pod) can bind-mount them into
sandboxes: ``<state_dir>/bin``, a directory of the node seen at
the same path in the agent's pod, as the exec FIFOs under it are.

Replaced only when its bytes differ, and then by a rename: a sandbox's mount holds
the file it was made with, never one half-written.
"""

from __future__ import annotations

import contextlib
import os

from sandlot.adapters.startup import StartupError, setting_name

TOOL_NAME = "sandlot-files"
EXECUTOR_NAME = "sandlot-exec"


def place_files_tool(source: str, state_dir: str) -> str | None:
    """The node's path of the files tool copied from ``source`` (the ``files_tool``
    setting); None when it is empty. ``StartupError`` naming the setting when the
    tool cannot be read or placed."""
    return place_tool(source, state_dir, TOOL_NAME, "files_tool", "the files tool")


def place_executor(source: str, state_dir: str) -> str | None:
    """The same for the executor (the ``executor`` setting)."""
    return place_tool(source, state_dir, EXECUTOR_NAME, "executor", "the executor")


def place_tool(source: str, state_dir: str, name: str, setting: str, what: str) -> str | None:
    if not source:
        return None
    target = os.path.join(state_dir, "bin", name)
    try:
        with open(source, "rb") as f:
            wanted = f.read()
        with contextlib.suppress(OSError), open(target, "rb") as f:
            if f.read() == wanted and os.stat(target).st_mode & 0o777 == 0o755:
                return target
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        temp = f"{target}.{os.getpid()}"
        with open(temp, "wb") as f:
            f.write(wanted)
            os.fchmod(f.fileno(), 0o755)
        os.replace(temp, target)
    except OSError as e:
        raise StartupError(
            f"{setting_name(setting)}: cannot place {what} {source} at {target}: {e}"
        ) from None
    return target


__all__ = ["EXECUTOR_NAME", "TOOL_NAME", "place_executor", "place_files_tool", "place_tool"]
