"""Moments as the API carries them: RFC 3339 in UTC with a ``Z``, the one format of
every time sandlot writes (status fields, containerd labels, messages)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

TimeSpec = Literal["auto", "seconds", "microseconds"]


def rfc3339(moment: datetime, timespec: TimeSpec = "microseconds") -> str:
    """``moment`` in UTC, to the microsecond (status fields: marks written within one
    second stay ordered); ``timespec`` as ``datetime.isoformat`` takes it: "seconds"
    for labels and messages people read, "auto" for a moment given as it is."""
    return moment.astimezone(UTC).isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_time(text: str | datetime | None) -> datetime | None:
    """An RFC 3339 time as the API server sends it (``Z`` or an offset); a datetime
    or None passes through."""
    if text is None or isinstance(text, datetime):
        return text
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def utcnow() -> datetime:
    """The wall clock in UTC: the clock the programs' parts take by default (a test
    hands them its own; decisions take the moment as data)."""
    return datetime.now(UTC)


__all__ = ["TimeSpec", "parse_time", "rfc3339", "utcnow"]
