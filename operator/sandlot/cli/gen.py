"""``sandlot gen crds|admission|docs``: write the files generated from the code
(``sandlot.devtools.generate``, imported only when the command runs)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from sandlot.api import admission, leaderfence, placementpolicy, writepolicy
from sandlot.cli.devimport import devtools

WHAT = {
    "crds": "write the CRD YAML into crds/ and the chart",
    "admission": f"write the admission policy templates into {admission.CHART_TEMPLATE}, "
    f"{writepolicy.CHART_TEMPLATE}, {leaderfence.CHART_TEMPLATE} and "
    f"{placementpolicy.CHART_TEMPLATE}",
    "docs": "write docs/settings.md and docs/metrics.md",
}


def register(sub: Any) -> None:
    gen = sub.add_parser("gen", help="generate files that come from the models")
    gen_sub = gen.add_subparsers(dest="what", metavar="WHAT", required=True)
    for what, help_ in WHAT.items():
        parser = gen_sub.add_parser(what, help=help_)
        parser.add_argument("--root", default=".", help="repository root (default: .)")
        parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    generate = devtools("generate", f"gen {args.what}")
    writers = {
        "crds": generate.write_crds,
        "admission": generate.write_admission,
        "docs": generate.write_docs,
    }
    for path in writers[args.what](Path(args.root)):
        print(f"wrote {path}")
    return 0
