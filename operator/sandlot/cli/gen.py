"""``sandlot gen crds``: write the CRDs generated from the models.
``sandlot gen admission``: write the chart's admission policy template from
``sandlot.api.admission``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sandlot.api.admission import CHART_TEMPLATE, chart_template
from sandlot.api.crdgen import CRD_DIRS, render_crds


def register(sub: Any) -> None:
    gen = sub.add_parser("gen", help="generate files that come from the models")
    gen_sub = gen.add_subparsers(dest="what", metavar="WHAT", required=True)
    crds = gen_sub.add_parser("crds", help="write the CRD YAML into crds/ and the chart")
    crds.add_argument("--root", default=".", help="repository root (default: .)")
    crds.set_defaults(func=run_crds)
    admission = gen_sub.add_parser(
        "admission", help=f"write the admission policy template into {CHART_TEMPLATE}"
    )
    admission.add_argument("--root", default=".", help="repository root (default: .)")
    admission.set_defaults(func=run_admission)
    docs = gen_sub.add_parser("docs", help="write docs/settings.md and docs/metrics.md")
    docs.add_argument("--root", default=".", help="repository root (default: .)")
    docs.set_defaults(func=run_docs)


def write_crds(root: Path) -> list[Path]:
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
    return written


def run_crds(args: argparse.Namespace) -> int:
    for path in write_crds(Path(args.root)):
        print(f"wrote {path}")
    return 0


def run_admission(args: argparse.Namespace) -> int:
    path = Path(args.root) / CHART_TEMPLATE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(chart_template())
    print(f"wrote {path}")
    return 0


def run_docs(args: argparse.Namespace) -> int:
    from sandlot.cli.docsgen import render_docs

    root = Path(args.root)
    for name, text in render_docs(root).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")
    return 0
