"""What a failed CNI operation says: the spec's error codes and the plugin's error
JSON turned into one exception type, so every caller handles one ``CniError`` (or its
timeout and missing-configuration kinds) whatever the plugin or ``ip`` printed."""

from __future__ import annotations

import json
from collections.abc import Mapping

# Well-known CNI error codes (spec, "Error"); 100+ are plugin-specific.
ERROR_CODES = {
    1: "incompatible CNI version",
    2: "unsupported field in network configuration",
    3: "container unknown or does not exist",
    4: "invalid necessary environment variables",
    5: "I/O failure",
    6: "failed to decode content",
    7: "invalid network config",
    11: "try again later",
}


class CniError(Exception):
    """A CNI operation failed; ``code``, ``msg`` and ``details`` are the plugin's error."""

    def __init__(
        self,
        message: str,
        *,
        code: int = 0,
        msg: str = "",
        details: str = "",
        plugin: str = "",
        command: str = "",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.msg = msg or message
        self.details = details
        self.plugin = plugin
        self.command = command


class CniTimeout(CniError):
    """A plugin (or ``ip``) did not finish within the operation's budget."""


class NoNetworkConfig(CniError):
    """The configuration directory holds no usable network configuration."""


def parse_error(
    stdout: bytes | str, stderr: bytes | str, returncode: int, *, plugin: str, command: str
) -> CniError:
    """A failed plugin run as a ``CniError``: the spec's error JSON on stdout when the
    plugin wrote one (``code``, ``msg``, ``details``), else its stderr."""
    out = stdout.decode(errors="replace") if isinstance(stdout, bytes) else stdout
    err = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    code, msg, details = 0, "", ""
    try:
        data = json.loads(out) if out.strip() else None
    except json.JSONDecodeError:
        data = None
    if isinstance(data, Mapping) and ("code" in data or "msg" in data):
        raw_code = data.get("code")
        code = raw_code if isinstance(raw_code, int) else 0
        msg = str(data.get("msg") or "")
        details = str(data.get("details") or "")
    if not msg:
        msg = (err.strip() or out.strip() or f"exit status {returncode}").splitlines()[-1]
    text = f"CNI plugin {plugin} {command} failed: {msg}"
    if details:
        text += f" ({details})"
    if code:
        text += f" [code {code}: {ERROR_CODES.get(code, 'plugin-specific')}]"
    return CniError(text, code=code, msg=msg, details=details, plugin=plugin, command=command)
