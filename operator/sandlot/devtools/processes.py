"""The child processes the development tools run: a build or an image step run to its
end within a bound, failing with its stderr; and the long-running ones they start
(containerd, a registry, the control plane's programs) ended, asked first, killed
when they do not go in time."""

from __future__ import annotations

import subprocess
from typing import Any


def run_bounded(
    argv: list[str],
    what: str,
    timeout: float,
    *,
    error: type[Exception] = RuntimeError,
    tail: int = 3000,
    **kw: Any,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end within ``timeout`` seconds, its output captured as text;
    ``error`` names ``what`` when it takes longer, or fails (with the last ``tail``
    characters of its stderr)."""
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, **kw
        )
    except subprocess.TimeoutExpired as exc:
        raise error(f"{what} took over {timeout:.0f}s") from exc
    if proc.returncode != 0:
        raise error(f"{what} failed (exit {proc.returncode}):\n{proc.stderr[-tail:]}")
    return proc


def terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; nothing when it has exited."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


__all__ = ["run_bounded", "terminate"]
