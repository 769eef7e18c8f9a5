"""The private kopf names ``sandlot.adapters.kopfprivate`` uses still exist.

The names are read from that module's source (its ``from kopf._... import``
lines and the underscored attributes it reads off ``registry``), so a new use
is checked without anyone listing it here, and nothing here imports the module:
a moved name fails with the reason, not with an ImportError at collection.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import tomllib
from importlib.metadata import version

import kopf
import pytest
from packaging.requirements import Requirement

from tests.support.kube import repo_root

MODULE = repo_root() / "operator" / "sandlot" / "adapters" / "kopfprivate.py"


def kopf_pin() -> str:
    """The kopf requirement as pyproject.toml declares it, e.g. ``kopf>=1.45.2,<1.46``."""
    project = tomllib.loads((repo_root() / "pyproject.toml").read_text())["project"]
    pin: str = next(d for d in project["dependencies"] if Requirement(d).name == "kopf")
    return pin


def private_imports(tree: ast.Module) -> list[tuple[str, str]]:
    """(module, name) for every ``from kopf._... import name``."""
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        and node.module is not None
        and node.module.startswith("kopf._")
        for alias in node.names
    ]


def registry_attributes(tree: ast.Module) -> set[str]:
    """Every underscored attribute read off a name called ``registry``."""
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "registry"
        and node.attr.startswith("_")
    }


def moved(source: str) -> list[str]:
    """What of kopf's private API the source relies on and the installed kopf lacks."""
    tree = ast.parse(source)
    problems = []
    for module_name, name in private_imports(tree):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            problems.append(f"no module {module_name}")
            continue
        if not hasattr(module, name):
            problems.append(f"{module_name} has no {name}")
    registry = kopf.OperatorRegistry()
    for attr in sorted(registry_attributes(tree)):
        if not hasattr(getattr(registry, attr, None), "has_handlers"):
            problems.append(f"OperatorRegistry has no {attr} with has_handlers()")
    return problems


def explain(problems: list[str]) -> str:
    return (
        f"kopf's private API moved: {'; '.join(problems)}. "
        f"sandlot.adapters.kopfprivate is tested against the pinned range {kopf_pin()!r} "
        f"(pyproject.toml), installed kopf is {version('kopf')}; adapt that module "
        "before widening the pin."
    )


def test_the_private_names_kopfprivate_uses_exist_in_the_installed_kopf() -> None:
    source = MODULE.read_text()
    assert private_imports(ast.parse(source)), "kopfprivate no longer imports kopf._*"
    problems = moved(source)
    assert not problems, explain(problems)


def test_the_recall_override_matches_kopfs_signature() -> None:
    if moved(MODULE.read_text()):
        pytest.fail(explain(moved(MODULE.read_text())))
    from kopf._core.reactor.inventory import ResourceMemories

    from sandlot.adapters.kopfprivate import WatchOnlyMemories

    ours = list(inspect.signature(WatchOnlyMemories.recall).parameters)
    theirs = list(inspect.signature(ResourceMemories.recall).parameters)
    assert ours == theirs, explain([f"ResourceMemories.recall takes {theirs}, not {ours}"])


def test_the_installed_kopf_is_inside_the_pinned_range() -> None:
    requirement = Requirement(kopf_pin())
    assert requirement.specifier.contains(version("kopf")), (
        f"installed kopf {version('kopf')} is outside {kopf_pin()!r}: "
        "sandlot.adapters.kopfprivate was tested only inside that range"
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from kopf._core.nowhere import Thing\n", ["no module kopf._core.nowhere"]),
        (
            "from kopf._core.reactor.inventory import Vanished\n",
            ["kopf._core.reactor.inventory has no Vanished"],
        ),
        (
            "registry._gone.has_handlers(r)\n",
            ["OperatorRegistry has no _gone with has_handlers()"],
        ),
        ("from kopf._core.reactor.inventory import ResourceMemories\n", []),
    ],
    ids=["a_moved_module", "a_renamed_class", "a_dropped_registry_attribute", "a_present_name"],
)
def test_a_moved_private_name_is_reported(source: str, expected: list[str]) -> None:
    assert moved(source) == expected
