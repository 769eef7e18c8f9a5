"""The floor of the operator's node timers: kopf alone, ticking one timer per
SandboxNode at the operator's resync interval with a handler that does nothing.

The operator keeps its per-node resync on a kopf timer (the design calls for it).
Every tick goes through kopf's handler machinery (state, kwargs, invocation, the
outcome, the sleep to the next one) before the operator's own work starts, so this
process's CPU over a resync interval is what the timers cost any kopf operator on
the same fleet: the floor of the operator's idle CPU beside the bare Lease reader's.

It is configured as the operator configures kopf (standalone, the same finalizer and
annotation storage, so it writes nothing to the nodes), prints ``{"ready": ...}``
once every node's timer has ticked, and stops when its stdin closes, printing how
many ticks it ran.

    python -m bench.kopffloor --kubeconfig K --interval SECONDS --nodes N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import kopf

from sandlot.adapters.kube import connection_params, load_api_client
from sandlot.api import GROUP, VERSION
from sandlot.controllers.kopfwiring import register_kopf


def registry_for(
    connection: dict[str, Any], interval: float, nodes: int, ready: threading.Event
) -> tuple[Any, dict[str, int]]:
    registry = kopf.OperatorRegistry()
    ticks = {"ticks": 0}

    register_kopf(registry, connection)

    @kopf.timer(GROUP, VERSION, "sandboxnodes", interval=interval, registry=registry)
    async def resync(name: str, body: kopf.Body, **_: Any) -> None:
        ticks["ticks"] += 1
        if ticks["ticks"] >= nodes:
            ready.set()

    return registry, ticks


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--interval", type=float, required=True)
    parser.add_argument("--nodes", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    ready = threading.Event()
    connection = connection_params(load_api_client(args.kubeconfig))
    registry, ticks = registry_for(connection, args.interval, args.nodes, ready)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def until_stdin_closes() -> None:
            sys.stdin.read()
            loop.call_soon_threadsafe(stop.set)

        def announce() -> None:
            ready.wait()
            print(json.dumps({"ready": True}), flush=True)

        threading.Thread(target=until_stdin_closes, daemon=True).start()
        threading.Thread(target=announce, daemon=True).start()
        await kopf.operator(registry=registry, clusterwide=True, standalone=True, stop_flag=stop)

    asyncio.run(run())
    print(json.dumps(ticks), flush=True)
    return 0


class TimerFloor:
    """The process, driven from the bench."""

    def __init__(self, kubeconfig: str, interval: float, nodes: int, timeout: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.kopffloor", "--kubeconfig", kubeconfig,
             "--interval", f"{interval:g}", "--nodes", str(nodes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[1],
        )  # fmt: skip
        self.ready = self._line(timeout, f"every one of {nodes} node timers ticked once")

    def _line(self, timeout: float, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([self.proc.stdout], [], [], 1.0)[0]:
                line = self.proc.stdout.readline()
                if not line:
                    break
                return dict(json.loads(line))
            if self.proc.poll() is not None:
                break
        self.proc.kill()
        raise TimeoutError(f"kopf timer floor: not {what} within {timeout:.0f}s "
                           f"(exit {self.proc.poll()})")  # fmt: skip

    def stop(self) -> int:
        """Stop it; the number of ticks it ran."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return int(self._line(30, "stopped")["ticks"])
        finally:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
