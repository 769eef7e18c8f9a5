"""The committed CRD YAML is exactly what the models generate."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from sandlot.api.crdgen import (
    AGENT_SANDBOX_CHART_TEMPLATE,
    AGENT_SANDBOX_CRD_DIR,
    CRD_DIRS,
    agent_sandbox_chart_template,
    crd_for,
    render_agent_sandbox_crds,
    render_crds,
)
from sandlot.api.sandbox import Sandbox

ROOT = Path(__file__).resolve().parents[2]
FIX = "regenerate with `make crds` (or `sandlot gen crds`) and commit the result"


@pytest.mark.parametrize("directory", CRD_DIRS)
def test_committed_crds_match_the_models(directory):
    rendered = render_crds()
    present = {p.name for p in (ROOT / directory).glob("sandlot.dev_*.yaml")}
    assert present == set(rendered), f"{directory}: files differ from the models; {FIX}"
    for name, text in rendered.items():
        committed = (ROOT / directory / name).read_text()
        assert committed == text, f"{directory}/{name} is out of date; {FIX}"


def test_sandbox_crd_declares_columns_selectable_field_and_terminal_rule():
    crd = crd_for(Sandbox)
    version = crd["spec"]["versions"][0]
    columns = [c["name"] for c in version["additionalPrinterColumns"] if "priority" not in c]
    assert columns == ["Phase", "Node", "IP", "Age"]
    assert version["selectableFields"] == [{"jsonPath": ".spec.nodeName"}]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    rules = status["x-kubernetes-validations"]
    assert any("oldSelf.phase" in r["rule"] and "Dead" in r["rule"] for r in rules)
    assert version["subresources"] == {"status": {}}


def test_generated_schema_is_structural():
    def walk(node: dict[str, Any], path: str) -> None:
        assert "$ref" not in node and "anyOf" not in node, path
        # Kubernetes' int-or-string (maxSurge) is the one structural node without a type.
        assert "type" in node or node.get("x-kubernetes-int-or-string") is True, (
            f"no type at {path}"
        )
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            walk(node["additionalProperties"], f"{path}{{}}")

    for text in [*render_crds().values(), *render_agent_sandbox_crds().values()]:
        crd = yaml.safe_load(text)
        walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], crd["metadata"]["name"])


def test_committed_agent_sandbox_crds_and_chart_template_match_the_models():
    rendered = render_agent_sandbox_crds()
    present = {p.name for p in (ROOT / AGENT_SANDBOX_CRD_DIR).glob("*.yaml")}
    assert present == set(rendered), f"{AGENT_SANDBOX_CRD_DIR}: files differ; {FIX}"
    for name, text in rendered.items():
        assert (ROOT / AGENT_SANDBOX_CRD_DIR / name).read_text() == text, f"{name}: {FIX}"
    template = (ROOT / AGENT_SANDBOX_CHART_TEMPLATE).read_text()
    assert template == agent_sandbox_chart_template(), f"{AGENT_SANDBOX_CHART_TEMPLATE}: {FIX}"
    # agent-sandbox's groups never land in the chart's crds/, which Helm always installs.
    assert not list((ROOT / "charts/sandlot/crds").glob("*agents.x-k8s.io*"))
