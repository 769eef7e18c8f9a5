"""Every key in ``sandlot.api.keys`` is one Kubernetes and containerd accept."""

from __future__ import annotations

import re

import pytest

from sandlot.api import keys

# Kubernetes' qualified name: an optional DNS-subdomain prefix and "/", then a
# name of at most 63 characters (alphanumerics, '-', '_', '.', alphanumeric ends).
NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")


def qualified_name_problem(key: str) -> str | None:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not SUBDOMAIN.match(prefix)):
        return f"prefix {prefix!r} is not a DNS subdomain"
    if not NAME.match(name):
        return f"name {name!r} is not a qualified name"
    return None


KEYS = {
    name: getattr(keys, name)
    for name in keys.__all__
    if name.endswith(("_LABEL", "_FINALIZER", "_KEY"))
}


@pytest.mark.parametrize("name", sorted(KEYS), ids=sorted(KEYS))
def test_every_key_is_a_valid_qualified_name(name: str) -> None:
    assert qualified_name_problem(KEYS[name]) is None, (name, qualified_name_problem(KEYS[name]))


@pytest.mark.parametrize(
    ("key", "problem"),
    [
        ("sandlot.dev/pool", None),
        ("Sandlot.dev/pool", "prefix 'Sandlot.dev' is not a DNS subdomain"),
        ("sandlot.dev/-pool", "name '-pool' is not a qualified name"),
        ("sandlot.dev/" + "x" * 64, "name '" + "x" * 64 + "' is not a qualified name"),
    ],
    ids=["valid", "uppercase_prefix", "leading_dash", "name_too_long"],
)
def test_the_check_refuses_what_kubernetes_refuses(key: str, problem: str | None) -> None:
    assert qualified_name_problem(key) == problem


def test_no_two_constants_name_the_same_key() -> None:
    values = list(KEYS.values())
    assert len(values) == len(set(values)), sorted(v for v in values if values.count(v) > 1)
