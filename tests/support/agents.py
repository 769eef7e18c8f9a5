"""Settings for a real agent in tests: a private containerd, short durations, no
metrics port. Tests pass only what differs from these."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandlot.agent.settings import AgentSettings
from sandlot.devtools.containerd import PrivateContainerd


def agent_settings(
    *,
    node: str,
    namespace: str,
    containerd: PrivateContainerd,
    ctr_ns: str,
    log_dir: Path,
    **overrides: Any,
) -> AgentSettings:
    values: dict[str, Any] = {
        "node_name": node,
        "namespace": namespace,
        "containerd_address": containerd.address,
        "containerd_namespace": ctr_ns,
        "containerd_root": str(containerd.root),
        "kill_wait": "2s",
        "call_timeout": "2s",
        "stop_grace": "2s",
        "reap_interval": "1s",
        "sync_interval": "0.3s",
        "lease_duration": "10s",
        "renew_interval": "1s",
        "metrics_port": 0,
        "node_address": "10.1.2.3",
        "log_dir": str(log_dir),
    }
    values.update(overrides)
    return AgentSettings(**values)
