"""The development tools (``sandlot.devtools``) as the commands that need them load
them: a checkout has them; the image and the runtime wheel leave them out, and
there such a command says so instead of a traceback."""

from __future__ import annotations

import importlib
from types import ModuleType

from sandlot.api.errors import UsageError

PACKAGE = "sandlot.devtools"


def devtools(module: str, command: str) -> ModuleType:
    """``sandlot.devtools.<module>``; a ``UsageError`` naming ``command`` when this
    installation has no development tools."""
    name = f"{PACKAGE}.{module}" if module else PACKAGE
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name is None or not (e.name == PACKAGE or e.name.startswith(PACKAGE + ".")):
            raise
        raise UsageError(
            f"`sandlot {command}` needs sandlot's development tools, which this installation "
            "leaves out (the image and the runtime wheel carry none): run it from a source "
            "checkout, e.g. `make demo`"
        ) from None


__all__ = ["devtools"]
