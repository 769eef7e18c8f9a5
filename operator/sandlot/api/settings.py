"""Settings models shared by the operator and the agent: durations written the
way operators write them (``300s``, ``5m``, ``1h30m``, or plain seconds) and the
base model every settings class uses.

Settings are validated once, at construction; a bad value is refused with a
message naming the setting, its flag and its environment variable (see
``sandlot.cli.options``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Annotated, Any, ClassVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    model_validator,
)
from pydantic.fields import FieldInfo

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


def require_positive(settings: BaseModel, names: Sequence[str]) -> None:
    """Refuse (ValueError, "<name> must be positive") the first of the durations
    ``names`` of ``settings`` that is zero or negative: for a model validator that
    checks them beside its other rules."""
    for name in names:
        if getattr(settings, name) <= timedelta(0):
            raise ValueError(f"{name} must be positive")


PemPath = Annotated[str, Field(max_length=4096)]
"""The path of a PEM file (a certificate, a key, a CA bundle)."""

ListenPort = Annotated[int, Field(ge=0, le=65535)]
"""A TCP port a program listens on; 0 means what its setting says (off, or any free port)."""


class SettingsModel(BaseModel):
    """Frozen, unknown keys refused, validated on assignment and at construction.

    A program's settings may nest a policy's own model (its fields, defaults and
    bounds stated once, there); ``FLAT`` names each nested field as a setting of
    its own, so flags, environment variables and the chart keep one flat name per
    setting: ``{"grace_period": ("node_health", "grace_period")}``. Flat keys are
    accepted at construction too.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    FLAT: ClassVar[Mapping[str, tuple[str, str]]] = {}

    @model_validator(mode="before")
    @classmethod
    def _nest_flat(cls, data: Any) -> Any:
        if not cls.FLAT or not isinstance(data, Mapping):
            return data
        values = dict(data)
        nested: dict[str, dict[str, Any]] = {}
        for flat, (outer, inner) in cls.FLAT.items():
            if flat in values:
                if outer in values:
                    raise ValueError(f"give {flat} or {outer}, not both")
                nested.setdefault(outer, {})[inner] = values.pop(flat)
        values.update(nested)
        return values


def setting_fields(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """Every setting of ``model`` by its flat name (a flag, a variable), in order:
    a nested model's fields named in ``FLAT`` stand where the nested field does."""
    flat: Mapping[str, tuple[str, str]] = getattr(model, "FLAT", {})
    by_outer: dict[str, list[tuple[str, str]]] = {}
    for name, (outer, inner) in flat.items():
        by_outer.setdefault(outer, []).append((name, inner))
    fields: dict[str, FieldInfo] = {}
    for name, field in model.model_fields.items():
        if name not in by_outer:
            fields[name] = field
            continue
        inner_model = field.annotation
        assert isinstance(inner_model, type) and issubclass(inner_model, BaseModel), name
        for flat_name, inner in by_outer[name]:
            fields[flat_name] = inner_model.model_fields[inner]
    return fields


def setting_name(model: type[BaseModel], loc: Sequence[Any]) -> str:
    """The flat name of the setting an error's location points at ("" if none)."""
    parts = [str(p) for p in loc if isinstance(p, str)]
    if not parts:
        return ""
    flat: Mapping[str, tuple[str, str]] = getattr(model, "FLAT", {})
    if len(parts) > 1:
        for name, where in flat.items():
            if where == (parts[0], parts[1]):
                return name
    return parts[0]
