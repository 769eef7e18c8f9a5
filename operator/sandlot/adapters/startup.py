"""Start-up checks whose failure is the user's setting, said in one line.

A program that cannot bind its metrics port, or whose namespace does not exist,
cannot do its job; the useful answer is the setting to change and the value it
had, not a traceback or a retry loop logging an HTTP dump every two seconds. Each
check raises ``StartupError`` (a ``UsageError``: the CLI prints it as one line and
exits non-zero). A failure that is not the user's (the API server unreachable)
is left to the caller's retries.
"""

from __future__ import annotations

import errno
import json

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.api.errors import UsageError


class StartupError(UsageError):
    """A setting that cannot work on this host or cluster; the message names it."""


def setting_name(field: str) -> str:
    """``metrics_port`` -> ``--metrics-port / SANDLOT_METRICS_PORT``."""
    return f"--{field.replace('_', '-')} / SANDLOT_{field.upper()}"


def cannot_listen(settings: str, where: object, e: OSError) -> StartupError:
    """The error for a listening socket that cannot be had: the settings behind it,
    where it was asked to listen, and why not."""
    why = "address already in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
    return StartupError(f"{settings} {where}: cannot listen: {why}")


def api_error_line(e: BaseException) -> str:
    """One line for an API error: status, reason and the server's message, no headers."""
    if isinstance(e, ApiException):
        message = ""
        if e.body:
            try:
                message = json.loads(e.body).get("message", "")
            except (ValueError, AttributeError):
                message = ""
        return f"HTTP {e.status} {e.reason}" + (f": {message}" if message else "")
    return " ".join(str(e).split())


def require_namespace(api: client.ApiClient, namespace: str, *, field: str = "namespace") -> None:
    """Raise ``StartupError`` when ``namespace`` does not exist; other failures (the
    API server unreachable, no right to read namespaces) pass: the programs retry."""
    try:
        client.CoreV1Api(api).read_namespace(namespace, _request_timeout=(3.0, 5.0))
    except ApiException as e:
        if e.status == 404:
            raise StartupError(
                f"namespace {namespace!r} does not exist: create it, or set "
                f"{setting_name(field)} to the namespace sandlot was installed in"
            ) from None
    except Exception:  # unreachable now is not a setting to blame
        return


__all__ = ["StartupError", "api_error_line", "cannot_listen", "require_namespace", "setting_name"]
