"""Run every benchmark and print one table of ratios, each measured in one run.

    .venv/bin/python bench/run.py [--quick]

``--quick`` skips the 10,000-sandbox memory run and shortens the churn run from
30 to 3 minutes. The scale run (``bench/scale.py``) uses 15,000 sandboxes over 500
nodes; ``--full`` makes it 150,000 over 5,000, and the same for the recovery run
(``bench/recovery.py``: a kill -9 and cold restart, then an API-server outage).
The agent start-up, start-latency and GC benchmarks need root (they run containers
on a private containerd).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def run(argv: list[str], timeout: float) -> str:
    print(f"$ {' '.join(argv)}", flush=True)
    proc = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=timeout, check=False
    )
    sys.stdout.write(proc.stdout)
    if proc.returncode not in (0, 1):
        sys.stdout.write(proc.stderr[-3000:])
    return proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="skip the 10,000-sandbox memory run and shorten the churn run to 3 minutes",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="run the scale benchmark at 150,000 sandboxes over 5,000 nodes (about 70 minutes)",
    )
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []

    out = Path(tempfile.mkdtemp(prefix="sl-bench-")) / "nodehealth.json"
    nh_args = [str(HERE / "nodehealth.py"), "--json", str(out)]
    if args.quick:
        nh_args += ["--memory", "0"]
    run(nh_args, timeout=3600)
    if out.exists():
        rows += json.loads(out.read_text())

    churn = out.with_name("churn.json")
    minutes = "3" if args.quick else "30"
    run([str(HERE / "churn.py"), "--minutes", minutes, "--json", str(churn)], timeout=3600)
    if churn.exists():
        rows += json.loads(churn.read_text())

    claims = out.with_name("claims.json")
    run([str(HERE / "claims.py"), "--json", str(claims)], timeout=1800)
    if claims.exists():
        rows += json.loads(claims.read_text())

    burst = out.with_name("claimburst.json")
    burst_args = [str(HERE / "claims.py"), "--burst", "--json", str(burst)]
    if args.quick:
        burst_args += ["--claims", "300", "--pool", "300", "--seconds", "15"]
    run(burst_args, timeout=3600)
    if burst.exists():
        rows += json.loads(burst.read_text())

    streams = out.with_name("streams.json")
    run([str(HERE / "streams.py"), "--json", str(streams)], timeout=1800)
    if streams.exists():
        rows += json.loads(streams.read_text())

    first = out.with_name("firstcommand.json")
    run([str(HERE / "firstcommand.py"), "--json", str(first)], timeout=1800)
    if first.exists():
        rows += json.loads(first.read_text())

    compat = out.with_name("compat.json")
    run([str(HERE / "compat.py"), "--json", str(compat)], timeout=1800)
    if compat.exists():
        rows += json.loads(compat.read_text())

    text = run([str(HERE / "agent_startup.py")], timeout=1800)
    m = re.search(r"ratio start-up / bound = ([\d.]+)", text)
    detail = re.search(r"(start-up[^\n]*)", text)
    if m:
        value = float(m.group(1))
        rows.append(
            {
                "benchmark": "agent start-up, 200 orphans, 5 wedged / bound",
                "value": value,
                "target": "<= 1",
                "ok": value <= 1,
                "detail": detail.group(1) if detail else "",
            }
        )

    start = out.with_name("start_latency.json")
    run([str(HERE / "start_latency.py"), "--json", str(start)], timeout=1800)
    if start.exists():
        rows += json.loads(start.read_text())

    gc = out.with_name("gc_forced.json")
    run([str(HERE / "gc_forced.py"), "--json", str(gc)], timeout=1800)
    if gc.exists():
        rows += json.loads(gc.read_text())

    scale = out.with_name("scale.json")
    scale_args = [str(HERE / "scale.py"), "--json", str(scale)]
    if args.full:
        scale_args.append("--full")
    run(scale_args, timeout=3 * 3600 if args.full else 3600)
    if scale.exists():
        rows += json.loads(scale.read_text())

    recovery = out.with_name("recovery.json")
    recovery_args = [str(HERE / "recovery.py"), "--json", str(recovery)]
    if args.full:
        recovery_args.append("--full")
    run(recovery_args, timeout=2 * 3600 if args.full else 3600)
    if recovery.exists():
        rows += json.loads(recovery.read_text())

    text = run([str(HERE / "pull.py")], timeout=1800)
    m = re.search(r"ratio sandlot/ctr: ([\d.]+)", text)
    if m:
        value = float(m.group(1))
        detail = re.search(r"(pull of [^\n]*)", text)
        rows.append(
            {
                "benchmark": "image pull, 64 MiB / ctr images pull --plain-http",
                "value": value,
                "target": "<= 1.2",
                "ok": value <= 1.2,
                "detail": detail.group(1) if detail else "",
            }
        )

    width = max(len(str(r["benchmark"])) for r in rows) if rows else 10
    print()
    print(f"{'benchmark':<{width}}  {'value':>9}  {'target':<28} ok")
    for r in rows:
        print(
            f"{r['benchmark']!s:<{width}}  {float(r['value']):>9.4g}  {r['target']!s:<28} "
            f"{'ok' if r['ok'] else 'MISSED'}"
        )
    for r in rows:
        print(f"  - {r['benchmark']}: {r['detail']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
