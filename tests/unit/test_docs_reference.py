"""The settings and metrics references cannot drift from the code."""

import re
from pathlib import Path

import pytest

from sandlot.devtools.docsgen import render_docs

ROOT = Path(__file__).resolve().parents[2]
FIX = "regenerate with `sandlot gen docs` and commit the result"


@pytest.mark.parametrize("name", sorted(render_docs(ROOT)))
def test_reference_matches_the_code(name):
    expected = render_docs(ROOT)[name]
    committed = (ROOT / name).read_text() if (ROOT / name).exists() else ""
    assert committed == expected, f"{name} is out of date: {FIX}"


def test_every_metric_named_in_the_code_is_in_the_reference():
    reference = (ROOT / "docs/metrics.md").read_text()
    documented = set(re.findall(r"`(sandlot_[a-z0-9_]+)`", reference))
    in_code = set()
    for path in (ROOT / "operator/sandlot").rglob("*.py"):
        in_code |= set(re.findall(r'"(sandlot_[a-z0-9_]+)"', path.read_text()))
    missing = {m for m in in_code if m not in documented and f"{m}_total" not in documented}
    assert not missing, f"metrics registered in code but not in docs/metrics.md: {sorted(missing)}"


def test_every_documented_setting_exists_in_the_code():
    reference = (ROOT / "docs/settings.md").read_text()
    documented = set(re.findall(r"`(SANDLOT_[A-Z0-9_]+)`", reference))
    from sandlot.agent.settings import AgentSettings
    from sandlot.api.settings import setting_fields
    from sandlot.cli.options import env_name
    from sandlot.controllers.settings import OperatorSettings
    from sandlot.gateway.settings import GatewaySettings

    models = (AgentSettings, OperatorSettings, GatewaySettings)
    real = {env_name(f) for m in models for f in setting_fields(m)}
    assert documented <= real, f"documented but gone from the code: {sorted(documented - real)}"
    assert real <= documented, f"in the code but not documented: {sorted(real - documented)}"


def architecture_paths() -> list[str]:
    """Every ``sandlot/...py`` path docs/architecture.md names (with or without
    the leading ``operator/``), relative to ``operator/``."""
    text = (ROOT / "docs/architecture.md").read_text()
    return sorted(set(re.findall(r"(?<![\w/.])(?:operator/)?(sandlot/[\w/]+\.py)\b", text)))


def test_the_architecture_map_names_code():
    named = architecture_paths()
    assert len(named) >= 20, f"docs/architecture.md names too few modules to be a map: {named}"


def test_every_module_the_architecture_map_names_exists():
    missing = [p for p in architecture_paths() if not (ROOT / "operator" / p).is_file()]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"
