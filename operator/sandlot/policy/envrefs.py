"""A sandbox's environment resolved as the kubelet resolves a container's.

``envFrom`` first, in order, then ``env``, a later variable of one name replacing
an earlier one. A missing object or key stops the start with the kubelet's words
(``secret "db" not found``, ``couldn't find key pw in Secret ns/db``), unless its
reference is ``optional``: then it is skipped. ConfigMaps give their ``data``
only, as the kubelet does.

Pure: the objects come as data (``Referenced``), as the operator brokered them to
the sandbox's node. An object the broker has not yet written is ``None``: that
stops the start too, whatever ``optional`` says, since the broker is only behind.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sandlot.api.envvars import EnvFromSource, EnvVar

Kind = Literal["secret", "configmap"]
ObjectKey = tuple[Kind, str]
"""(kind, name) of a referenced object in the sandbox's namespace."""

_TITLE: dict[Kind, str] = {"secret": "Secret", "configmap": "ConfigMap"}


@dataclass(frozen=True)
class Referenced:
    """What the broker found of one referenced object: its keys wanted by this
    node's sandboxes, or ``found=False`` when the object does not exist."""

    found: bool
    data: Mapping[str, str] = field(default_factory=dict)


class EnvReferenceMissing(Exception):
    """An object or key a sandbox needs is not there: the start waits."""


def wanted_keys(
    env: Sequence[EnvVar], env_from: Sequence[EnvFromSource]
) -> dict[ObjectKey, set[str] | None]:
    """The keys each referenced object must bring; ``None`` for all of them (envFrom)."""
    wanted: dict[ObjectKey, set[str] | None] = {}
    for source in env_from:
        wanted[_from_key(source)] = None
    for var in env:
        ref = _var_ref(var)
        if ref is None:
            continue
        obj, key, _ = ref
        keys = wanted.setdefault(obj, set())
        if keys is not None:
            keys.add(key)
    return wanted


def resolve(
    namespace: str,
    env: Sequence[EnvVar],
    env_from: Sequence[EnvFromSource],
    objects: Mapping[ObjectKey, Referenced | None],
) -> list[tuple[str, str]]:
    """The variables, in order of first appearance, each with its last value.

    Raises ``EnvReferenceMissing`` naming the first missing object or key."""
    result: dict[str, str] = {}
    for source in env_from:
        obj = _from_key(source)
        ref = source.secret_ref or source.config_map_ref
        assert ref is not None  # the model has exactly one
        found = _lookup(objects, obj, optional=bool(ref.optional))
        if found is None:
            continue
        for key, value in found.data.items():
            result[source.prefix + key] = value
    for var in env:
        target = _var_ref(var)
        if target is None:
            result[var.name] = var.value
            continue
        obj, key, optional = target
        found = _lookup(objects, obj, optional=optional)
        if found is None:
            continue
        if key not in found.data:
            if optional:
                continue
            raise EnvReferenceMissing(
                f"couldn't find key {key} in {_TITLE[obj[0]]} {namespace}/{obj[1]}"
            )
        result[var.name] = found.data[key]
    return list(result.items())


def encode(found: Referenced) -> str:
    """A brokered entry's value (base64 of JSON, as a Secret's data holds it)."""
    document = {"data": dict(found.data)} if found.found else {"missing": True}
    return base64.b64encode(json.dumps(document, sort_keys=True).encode()).decode()


def decode(value: str) -> Referenced | None:
    """A brokered entry as ``encode`` wrote it; None when it is not one."""
    try:
        document = json.loads(base64.b64decode(value))
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    if document.get("missing"):
        return Referenced(found=False)
    data = document.get("data")
    if not isinstance(data, dict):
        return None
    return Referenced(found=True, data={str(k): str(v) for k, v in data.items()})


def _lookup(
    objects: Mapping[ObjectKey, Referenced | None], obj: ObjectKey, *, optional: bool
) -> Referenced | None:
    kind, name = obj
    found = objects.get(obj)
    if found is None:
        raise EnvReferenceMissing(f'{kind} "{name}" not yet available on this node')
    if not found.found:
        if optional:
            return None
        raise EnvReferenceMissing(f'{kind} "{name}" not found')
    return found


def _from_key(source: EnvFromSource) -> ObjectKey:
    if source.secret_ref is not None:
        return ("secret", source.secret_ref.name)
    assert source.config_map_ref is not None
    return ("configmap", source.config_map_ref.name)


def _var_ref(var: EnvVar) -> tuple[ObjectKey, str, bool] | None:
    """The object, key and optional of a variable's valueFrom; None for a plain value."""
    if var.value_from is None:
        return None
    kind: Kind = "secret" if var.value_from.secret_key_ref is not None else "configmap"
    ref = var.value_from.secret_key_ref or var.value_from.config_map_key_ref
    assert ref is not None  # the model has exactly one
    return (kind, ref.name), ref.key, bool(ref.optional)


__all__ = [
    "EnvReferenceMissing",
    "Kind",
    "ObjectKey",
    "Referenced",
    "decode",
    "encode",
    "resolve",
    "wanted_keys",
]
