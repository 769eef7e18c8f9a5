"""The files tool on the node: the agent's copy of ``operator/filetool``'s static
binary, placed where runc (which runs on the node, not in the agent's pod) can
bind-mount it into sandboxes: ``<state_dir>/bin``, a directory of the node seen at
the same path in the agent's pod, as the exec FIFOs under it are.

Replaced only when its bytes differ, and then by a rename: a sandbox's mount holds
the file it was made with, never one half-written.
"""

from __future__ import annotations

import contextlib
import os

from sandlot.adapters.startup import StartupError, setting_name

TOOL_NAME = "sandlot-files"


def place_files_tool(source: str, state_dir: str) -> str | None:
    """The node's path of the files tool copied from ``source`` (the ``files_tool``
    setting); None when it is empty. ``StartupError`` naming the setting when the
    tool cannot be read or placed."""
    if not source:
        return None
    target = os.path.join(state_dir, "bin", TOOL_NAME)
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
            f"{setting_name('files_tool')}: cannot place the files tool {source} at {target}: {e}"
        ) from None
    return target


__all__ = ["TOOL_NAME", "place_files_tool"]
