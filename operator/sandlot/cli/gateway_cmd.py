"""``sandlot gateway``: the stream gateway behind ``sandlot logs`` and ``sandlot exec``
(the aggregated API ``subresources.sandlot.dev``; a Deployment beside the operator).

Every setting of ``GatewaySettings`` is a flag and a ``SANDLOT_*`` environment
variable; a bad value is refused before anything listens, naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

from sandlot.cli.options import add_program, settings_from
from sandlot.gateway.settings import GatewaySettings


def register(sub: Any) -> None:
    add_program(
        sub,
        "gateway",
        GatewaySettings,
        run_gateway,
        summary="run the stream gateway (sandboxes/log and sandboxes/exec behind the API server)",
        description="Serve the aggregated API subresources.sandlot.dev and relay each "
        "stream to the sandbox's node agent over mutual TLS.",
    )


def run_gateway(args: argparse.Namespace) -> int:
    from sandlot.gateway.runner import run

    return run(settings_from(GatewaySettings, args), kubeconfig=args.kubeconfig)
