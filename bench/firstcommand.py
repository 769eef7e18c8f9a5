"""A command's round trip through the whole path, by the sandbox's executor against
the runtime's exec and ``ctr tasks exec``, measured in one run on one node.

The rig is ``bench/streams.py``'s: a local control plane with its front proxy, the
stream gateway and one real agent on a private containerd, one Running sandbox.
``true`` is run through the API server, the gateway and the agent as the CLI or an
SDK does (a WebSocket opened and read to its status), three ways in turn on the
same sandbox: through its executor (the agent's default), through the runtime's
exec (the same agent with its executors switched off), and ``ctr tasks exec``
(containerd's own client, a process start included); and, to show where the rest
goes, through the executor straight to the agent (mutual TLS with the gateway's
certificate, no API server, no gateway). Each way one at a time, then
20 at once; p50 and p99 of each command's round trip. Targets, through the
executor: p50 <= 10 ms and p99 <= 25 ms.

    sudo .venv/bin/python bench/firstcommand.py [--execs 100] [--burst 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from websockets.sync.client import connect

from bench.nodehealth import Bench
from bench.streams import FAILURES, drain, pct, real_node, timed
from sandlot.adapters.mtls import client_context
from sandlot.adapters.streamclient import open_stream
from sandlot.agent.main import Agent
from sandlot.api import GROUP, VERSION
from sandlot.devtools.certs import GATEWAY_NAME
from sandlot.devtools.controlplane import executor_path, files_tool_path
from sandlot.policy.agentcerts import agent_server_name
from sandlot.policy.streams import (
    EXEC,
    STATUS,
    STREAM_OPTIONS_HEADER,
    SUBPROTOCOL,
    StreamRequest,
    agent_request,
    api_path,
    decode_frame,
)

IMAGE = "docker.io/sandlot/bench-firstcommand:1"
NODE = "bench-firstcommand"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=100, help="commands one at a time, each way")
    parser.add_argument("--burst", type=int, default=20, help="commands at once")
    parser.add_argument("--rounds", type=int, default=5, help="bursts, each way")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sl-bench-first-"))
    bench = Bench(work)
    try:
        with real_node(
            bench,
            work,
            NODE,
            IMAGE,
            agent={"executor": str(executor_path()), "files_tool": str(files_tool_path())},
            gateway={
                "max_sessions": max(256, 4 * args.burst),
                "max_sessions_per_user": 2 * args.burst,
            },
        ) as (agent, address, ctr_ns):
            rows = measure(bench, agent, address, ctr_ns, args, work / "certs")
    finally:
        bench.close()
    if args.json:
        Path(args.json).write_text(json.dumps(rows))
    return 0 if all(r["ok"] for r in rows) else 1


def _sandbox(bench: Bench, agent: Agent) -> str:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Sandbox",
        "metadata": {"name": "target"},
        "spec": {"image": IMAGE, "command": ["sleep", "100000"], "nodeName": NODE},
    }
    bench.objs.create_namespaced_custom_object(GROUP, VERSION, bench.ns, "sandboxes", body)
    bench.objs.patch_namespaced_custom_object_status(
        GROUP, VERSION, bench.ns, "sandboxes", "target", {"status": {"phase": "Scheduled"}}
    )

    def running() -> bool:
        sb = agent.sandbox_watch.get(f"{bench.ns}/target") or {}
        return (sb.get("status") or {}).get("phase") == "Running"

    bench.wait(running, 60, "the sandbox Running")
    sandbox = agent.sandbox_watch.get(f"{bench.ns}/target") or {}
    return str(sandbox["status"]["containerId"])


def measure(
    bench: Bench,
    agent: Agent,
    address: str,
    ctr_ns: str,
    args: argparse.Namespace,
    certs: Path,
) -> list[dict[str, Any]]:
    container = _sandbox(bench, agent)
    server = agent.streams
    assert server is not None and server.executors is not None, "the agent has no executor"
    executors = server.executors
    run_true = api_path(StreamRequest(EXEC, bench.ns, "target", command=("true",)))

    def through_agent() -> None:
        try:
            drain(open_stream(bench.api, run_true))
        except Exception as e:
            FAILURES.append(f"{type(e).__name__}: {e}")

    def executor() -> None:
        server.executors = executors
        through_agent()

    def runtime() -> None:
        server.executors = None
        through_agent()

    tls = client_context(
        str(certs / "sandlot-agent-ca.crt"),  # the CA the gateway trusts for agents
        str(certs / f"{GATEWAY_NAME}.crt"),
        str(certs / f"{GATEWAY_NAME}.key"),
    )
    path, options = agent_request(StreamRequest(EXEC, bench.ns, "target", command=("true",)))
    url = f"wss://{agent.settings.stream_bind}:{agent.settings.stream_port}{path}"

    def agent_direct() -> None:
        server.executors = executors
        try:
            with connect(
                url,
                ssl=tls,
                server_hostname=agent_server_name(NODE),
                additional_headers={STREAM_OPTIONS_HEADER: options},
                subprotocols=[SUBPROTOCOL],  # type: ignore[list-item]
                compression=None,
                open_timeout=30,
            ) as ws:
                while decode_frame(bytes(ws.recv(timeout=30)))[0] != STATUS:  # type: ignore[arg-type]
                    pass
        except Exception as e:
            FAILURES.append(f"agent: {type(e).__name__}: {e}")

    def ctr() -> None:
        try:
            subprocess.run(
                ["ctr", "-a", address, "-n", ctr_ns, "tasks", "exec",
                 "--exec-id", f"b{uuid.uuid4().hex[:8]}", container, "true"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
        except subprocess.SubprocessError as e:
            FAILURES.append(f"ctr: {type(e).__name__}: {e}")

    first_ms = timed(executor)  # the sandbox's first command starts its executor
    for warm in (executor, runtime, ctr):
        warm()
    ways: dict[str, Callable[[], None]] = {
        "executor": executor,
        "runtime": runtime,
        "ctr": ctr,
        "agent": agent_direct,
    }
    alone: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.execs):  # interleaved: each way sees the same load
        for name, fn in ways.items():
            alone[name].append(timed(fn))
    together: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            if name in ("executor", "runtime"):
                server.executors = executors if name == "executor" else None
            call = through_agent if name in ("executor", "runtime") else fn
            with ThreadPoolExecutor(args.burst) as pool:
                together[name] += pool.map(lambda _, c=call: timed(c), range(args.burst))
    server.executors = executors
    fallbacks = agent.registry.get_sample_value(
        "sandlot_exec_fallbacks_total", {"reason": "broken"}
    )
    rows: list[dict[str, Any]] = []

    def row(name: str, value: float, target: str, ok: bool, detail: str) -> None:
        bench.row(name, value, target, ok, detail)
        rows.append(bench.rows[-1])

    for label, samples in (
        (f"one at a time, {args.execs}", alone),
        (f"{args.burst} at once", together),
    ):
        p50 = {n: statistics.median(v) for n, v in samples.items()}
        p99 = {n: pct(v, 0.99) for n, v in samples.items()}
        detail = (
            f"p50 executor {p50['executor']:.1f} ms, runtime {p50['runtime']:.1f} ms, "
            f"ctr {p50['ctr']:.1f} ms; p99 executor {p99['executor']:.1f} ms, runtime "
            f"{p99['runtime']:.1f} ms, ctr {p99['ctr']:.1f} ms; executor/runtime p50 "
            f"{p50['executor'] / p50['runtime']:.2f}, executor/ctr p50 "
            f"{p50['executor'] / p50['ctr']:.2f}; straight to the agent by the executor "
            f"p50 {p50['agent']:.1f} ms p99 {p99['agent']:.1f} ms; "
            f"load {os.getloadavg()[0]:.2f}"
        )
        row(f"`true` via executor p50 ms ({label})", p50["executor"], "<= 10",
            p50["executor"] <= 10, detail)  # fmt: skip
        row(f"`true` via executor p99 ms ({label})", p99["executor"], "<= 25",
            p99["executor"] <= 25, detail)  # fmt: skip
    row(
        "first command of a sandbox (starts its executor) ms",
        first_ms,
        "report; no failures",
        not FAILURES,
        f"{len(FAILURES)} failed"
        + (f" (first: {FAILURES[0][:160]})" if FAILURES else "")
        + f"; executor fallbacks (broken) {fallbacks or 0:.0f}",
    )
    return rows


if __name__ == "__main__":
    sys.exit(main())
