"""Ordering two resourceVersions of one object, as Kubernetes defines it.

KEP-5504 (Comparable Resource Version, stable in Kubernetes 1.35) made the
ordering part of the API: a well-formed resourceVersion is a decimal integer with
no leading zero, and of two such versions of objects of one resource the longer is
the newer, else the lexically greater. Anything else is not comparable, and the
caller must not guess an order.
"""

from __future__ import annotations

import re

_WELL_FORMED = re.compile(r"[1-9][0-9]*")


def newer(candidate: str | None, than: str | None) -> bool | None:
    """Whether ``candidate`` is a later version than ``than``: True, False (the same
    or older), or None when either is missing or not well-formed."""
    if not candidate or not than:
        return None
    if not (_WELL_FORMED.fullmatch(candidate) and _WELL_FORMED.fullmatch(than)):
        return None
    return (len(candidate), candidate) > (len(than), than)


__all__ = ["newer"]
