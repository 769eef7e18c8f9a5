"""``sandlot operator``: run the operator (kopf, embedded) against KUBECONFIG or
the in-cluster config."""

from __future__ import annotations

import argparse
from typing import Any

from sandlot.cli.options import add_program, settings_from
from sandlot.controllers.settings import OperatorSettings


def register(sub: Any) -> None:
    add_program(
        sub,
        "operator",
        OperatorSettings,
        run,
        summary="run the operator (node health, scheduling, pools)",
        description="Every flag can also be set by its SANDLOT_* environment variable.",
    )


def run(args: argparse.Namespace) -> int:
    from sandlot.cli.process import ExitWatchdog, exit_now
    from sandlot.controllers.operator import run_blocking

    settings = settings_from(OperatorSettings, args)
    watchdog = ExitWatchdog()
    run_blocking(settings, kubeconfig=args.kubeconfig, on_signal=watchdog.arm)
    exit_now(0)
