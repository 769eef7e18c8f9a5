"""Operator start-up from two source trees on one fleet, alternated.

Creates one fleet (``bench/scale.py``'s: N nodes whose Leases are renewed, M Running
sandboxes), then starts the operator from each tree in turn, ``--rounds`` times,
and prints each start's first node decision, every node's, peak and final RSS. A
change to start-up memory is measured against the tree before it on the same
fleet, the same API server and the same load.

    .venv/bin/python bench/startup_ab.py --sandboxes 3000 --nodes 100 OLD/operator NEW/operator

Each tree is a directory holding the ``sandlot`` package (it goes first on the
operator's PYTHONPATH); ``git archive REV | tar -x -C DIR`` makes one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.nodehealth import rss_kb
from bench.scale import LEASE_NS, Scale
from bench.scalefleet import Agents, create_nodes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--sandboxes", type=int, default=3000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sl-ab-"))
    scale = Scale(work, args.nodes, args.sandboxes, 5.0)
    try:
        create_nodes(scale.kubeconfig, scale.nodes)
        scale.agents = Agents(scale.kubeconfig, LEASE_NS, scale.nodes, work, scale.every,
                              scale.duration)  # fmt: skip
        scale.populate()
        for _ in range(args.rounds):
            for tree in args.trees:
                os.environ["PYTHONPATH"] = str(tree.resolve())
                scale.figures.pop("peak_kb", None)
                op = scale.start()
                f = scale.figures
                time.sleep(5)
                print(json.dumps({
                    "tree": str(tree),
                    "first_decision_s": round(f["first_decision_s"], 2),
                    "all_decisions_s": round(f["all_decisions_s"], 2),
                    "peak_mib": round(f["peak_kb"] / 1024, 1),
                    "rss_mib": round(rss_kb(op.proc.pid) / 1024, 1),
                }), flush=True)  # fmt: skip
                op.stop()
    finally:
        scale.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
