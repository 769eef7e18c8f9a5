"""``sandlot router-url``: the ``api_url`` agent-sandbox's client is given.

Programs written for kubernetes-sigs/agent-sandbox's Python client reach sandboxes
through its router; sandlot serves that protocol behind the API server
(``sandlot.policy.router``), so the client's ``SandboxDirectConnectionConfig`` gets
this URL, and the user's own credentials (docs/agent-sandbox.md).
"""

from __future__ import annotations

import argparse
from typing import Any

from sandlot.policy.router import api_url


def register(sub: Any) -> None:
    p = sub.add_parser(
        "router-url",
        help="print the api_url of agent-sandbox's client for a namespace",
        description="The URL agent-sandbox's client takes as "
        "SandboxDirectConnectionConfig(api_url=...): sandlot's router of the namespace, "
        "on the API server of the kubeconfig (or behind `kubectl proxy` with --proxy).",
    )
    p.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    p.add_argument(
        "--proxy",
        default=None,
        metavar="URL",
        help="the address of `kubectl proxy` (http://127.0.0.1:8001) instead of the API server",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    p.set_defaults(func=run_router_url)


def run_router_url(args: argparse.Namespace) -> int:
    from sandlot.adapters.kube import load_api_client

    if args.proxy:
        server = args.proxy
    else:
        api = load_api_client(args.kubeconfig)
        try:
            server = str(api.configuration.host)
        finally:
            api.close()
    print(api_url(server, args.namespace))
    return 0
