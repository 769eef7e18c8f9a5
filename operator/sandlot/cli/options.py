"""Command-line flags and environment variables from a settings model.

Every field of a settings model becomes a flag (``--grace-period``) and an
environment variable (``SANDLOT_GRACE_PERIOD``); the flag wins over the
environment, the environment over the default. Validation happens once, in the
model; its errors are turned into one message per bad setting that names the
flag and the variable.
"""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from sandlot.api.errors import UsageError
from sandlot.api.settings import parse_duration, setting_fields, setting_name

M = TypeVar("M", bound=BaseModel)

ENV_PREFIX = "SANDLOT_"


class SettingsError(UsageError):
    """A setting its model refused, with one message per bad setting."""


def duration(value: str) -> str:
    """argparse ``type`` of a duration flag: a bad value is refused while parsing
    (usage line, exit 2); a good one is kept as written, for messages."""
    try:
        parse_duration(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return value


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _is_list(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (list, tuple)


def add_settings_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per setting; values stay strings until the model validates them."""
    for name, field in setting_fields(model).items():
        help_text = (field.description or "").replace("%", "%%")
        if field.is_required():
            help_text += f" [env {env_name(name)}; required]"
        else:
            default = field.get_default(call_default_factory=True)
            shown = default if not isinstance(default, list | tuple) or default else "none"
            help_text += f" [env {env_name(name)}; default {_show(shown)}]"
        if _is_list(field.annotation):
            parser.add_argument(
                flag_name(name), dest=name, action="append", default=None, help=help_text
            )
        elif field.annotation is bool:
            parser.add_argument(
                flag_name(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        else:
            parser.add_argument(flag_name(name), dest=name, default=None, help=help_text)


def add_program(
    sub: Any,
    name: str,
    model: type[BaseModel],
    run: Callable[[argparse.Namespace], int],
    *,
    summary: str,
    description: str,
) -> argparse.ArgumentParser:
    """The command ``name`` of a program that runs in the cluster (``run`` it): its
    ``--kubeconfig``, then a flag per setting of ``model``."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=description)
    parser.add_argument(
        "--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)"
    )
    add_settings_flags(parser, model)
    parser.set_defaults(func=run)
    return parser


def _show(value: Any) -> str:
    from datetime import timedelta

    if isinstance(value, timedelta):
        return f"{value.total_seconds():g}s"
    return str(value)


def settings_from(
    model: type[M],
    args: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> M:
    """Build ``model`` from flags, then environment, then defaults; one clear error."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    fields = setting_fields(model)
    for name, field in fields.items():
        flag_value = getattr(args, name, None)
        if flag_value is not None:
            values[name] = flag_value
        elif env_name(name) in environ:
            raw = environ[env_name(name)]
            values[name] = [v for v in raw.split(",") if v] if _is_list(field.annotation) else raw
    values.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return model(**values)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            field_name = setting_name(model, err["loc"])
            where = (
                f"{flag_name(field_name)} / {env_name(field_name)}"
                if field_name in fields
                else "settings"
            )
            given = values.get(field_name, "(default)") if field_name else ""
            problems.append(f"{where}: {err['msg']} (given: {given!r})")
        raise SettingsError("invalid settings: " + "; ".join(problems)) from None
