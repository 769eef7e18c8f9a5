"""``sandlot agent --node NAME``: the node agent (one per node, as a DaemonSet).

Every setting of ``AgentSettings`` is a flag and a ``SANDLOT_*`` environment
variable; a bad value is refused before anything connects, naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

from sandlot.agent.settings import AgentSettings
from sandlot.cli.options import add_program, settings_from


def register(sub: Any) -> None:
    parser = add_program(
        sub,
        "agent",
        AgentSettings,
        run_agent,
        summary="run the node agent: heartbeat, sandboxes, teardown, reaper, image GC",
        description="Run this node's agent against its containerd and the cluster.",
    )
    parser.add_argument(
        "--node", dest="node_name", default=None, help="this node's name (same as --node-name)"
    )


def run_agent(args: argparse.Namespace) -> int:
    from sandlot.agent.runner import run
    from sandlot.cli.process import ExitWatchdog, exit_now

    settings = settings_from(AgentSettings, args)
    watchdog = ExitWatchdog()
    exit_now(run(settings, kubeconfig=args.kubeconfig, on_signal=watchdog.arm))
