"""Ending the child processes the development tools start (containerd, a registry,
the control plane's programs): asked first, killed when they do not go in time."""

from __future__ import annotations

import subprocess


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


__all__ = ["terminate"]
