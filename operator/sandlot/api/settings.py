"""Settings models shared by the operator and the agent: durations written the
way operators write them (``300s``, ``5m``, ``1h30m``, or plain seconds) and the
base model every settings class uses.

Settings are validated once, at construction; a bad value is refused with a
message naming the setting, its flag and its environment variable (see
``sandlot.cli.options``).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, PlainSerializer

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def parse_duration(value: Any) -> timedelta:
    """``"300s"``, ``"5m"``, ``"1h30m"``, ``"2.5s"``, ``300`` or a timedelta."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=float(value))
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d+(\.\d+)?", text):
            return timedelta(seconds=float(text))
        if text and _PART.sub("", text) == "":
            return timedelta(seconds=sum(float(n) * _UNITS[u] for n, u in _PART.findall(text)))
    raise ValueError(f"{value!r} is not a duration (use e.g. 300s, 5m, 1h30m, 250ms)")


def format_duration(value: timedelta) -> str:
    seconds = value.total_seconds()
    return f"{seconds:g}s"


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
]


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be positive")
    return value


PositiveDuration = Annotated[Duration, AfterValidator(_positive)]
"""A duration above zero: intervals, deadlines and waits that must pass."""


class SettingsModel(BaseModel):
    """Frozen, unknown keys refused, validated on assignment and at construction."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)
