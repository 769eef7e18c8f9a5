"""The agent as a process: its API client, its signals, its exit code.

Sandboxes keep running after it exits: the next agent re-adopts them.
"""

from __future__ import annotations

import logging
import signal as signals
from collections.abc import Callable

from sandlot.adapters.startup import require_namespace
from sandlot.agent.main import Agent
from sandlot.agent.settings import AgentSettings

log = logging.getLogger(__name__)


def run(
    settings: AgentSettings,
    kubeconfig: str | None = None,
    *,
    on_signal: Callable[[], None] | None = None,
) -> int:
    """Run the agent until SIGTERM/SIGINT (sandboxes keep running after it exits);
    ``on_signal`` is called on the first signal (the CLI arms its exit watchdog)."""
    from sandlot.adapters.kube import load_api_client

    api = load_api_client(kubeconfig)
    require_namespace(api, settings.namespace)
    agent = Agent(settings, api)

    def on_stop_signal(signum: int, _frame: object) -> None:
        if not agent.stopping:
            log.info("signal %d: shutting down (sandboxes keep running)", signum)
            if on_signal is not None:
                on_signal()
        agent.request_stop()

    for sig in (signals.SIGTERM, signals.SIGINT):
        signals.signal(sig, on_stop_signal)
    try:
        return agent.run_forever()
    finally:
        api.close()


__all__ = ["run"]
