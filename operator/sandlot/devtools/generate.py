"""Write the files generated from the code: the CRDs (from the API models), the
chart's admission policies (from ``sandlot.api.admission``,
``sandlot.api.writepolicy``, ``sandlot.api.leaderfence`` and
``sandlot.api.placementpolicy``) and the settings and
metrics references (``sandlot.devtools.docsgen``). Each has one source, and a
test fails when a committed copy has drifted from it."""

from __future__ import annotations

from pathlib import Path

from sandlot.api import admission, leaderfence, placementpolicy, writepolicy
from sandlot.api.crdgen import (
    AGENT_SANDBOX_CHART_TEMPLATE,
    AGENT_SANDBOX_CRD_DIR,
    CRD_DIRS,
    agent_sandbox_chart_template,
    render_agent_sandbox_crds,
    render_crds,
)
from sandlot.devtools.docsgen import render_docs


def write_crds(root: Path) -> list[Path]:
    """Write every CRD into each of ``CRD_DIRS``, removing ones no model renders."""
    written = []
    rendered = render_crds()
    for d in CRD_DIRS:
        target = root / d
        target.mkdir(parents=True, exist_ok=True)
        for stale in target.glob("sandlot.dev_*.yaml"):
            if stale.name not in rendered:
                stale.unlink()
        for name, text in rendered.items():
            path = target / name
            path.write_text(text)
            written.append(path)
    compat = root / AGENT_SANDBOX_CRD_DIR
    compat.mkdir(parents=True, exist_ok=True)
    for name, text in render_agent_sandbox_crds().items():
        path = compat / name
        path.write_text(text)
        written.append(path)
    template = root / AGENT_SANDBOX_CHART_TEMPLATE
    template.write_text(agent_sandbox_chart_template())
    written.append(template)
    return written


def write_admission(root: Path) -> list[Path]:
    """Write the chart's admission policy templates."""
    written = []
    for module in (admission, writepolicy, leaderfence, placementpolicy):
        path = root / module.CHART_TEMPLATE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(module.chart_template())
        written.append(path)
    return written


def write_docs(root: Path) -> list[Path]:
    """Write docs/settings.md and docs/metrics.md."""
    written = []
    for name, text in render_docs(root).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written
