"""The one exception class for input a person gave that cannot be used.

A flag, an environment variable, a setting or a kubeconfig the user pointed at:
``sandlot`` prints such an error as one line and exits 2, because the message is
the whole story and a traceback would bury it. Every other exception, a
``ValueError`` from deep inside a library included, is a fault to diagnose and
keeps its traceback. It lives in ``api`` so every layer can raise it (a bad
kubeconfig is found in ``adapters``).
"""

from __future__ import annotations


class UsageError(Exception):
    """Bad input on the command line, in the environment or in a file it names."""


__all__ = ["UsageError"]
