"""The API of sandlot as pydantic models: the single source of truth.

The CRD YAML in ``crds/`` and the chart is generated from these models
(``sandlot.api.crdgen``); field descriptions become ``kubectl explain`` text.
No I/O here.
"""

from sandlot.api.cacheprune import CachePrune, CachePruneSpec, CachePruneStatus, NodePruneResult
from sandlot.api.common import GROUP, VERSION, Condition
from sandlot.api.node import (
    NodeGcStatus,
    NodeHealthTracking,
    SandboxNode,
    SandboxNodeSpec,
    SandboxNodeStatus,
)
from sandlot.api.pool import SandboxPool, SandboxPoolSpec, SandboxPoolStatus, SandboxTemplate
from sandlot.api.sandbox import (
    TERMINAL_PHASES,
    Sandbox,
    SandboxPhase,
    SandboxSpec,
    SandboxStatus,
)

__all__ = [
    "GROUP",
    "TERMINAL_PHASES",
    "VERSION",
    "CachePrune",
    "CachePruneSpec",
    "CachePruneStatus",
    "Condition",
    "NodeGcStatus",
    "NodeHealthTracking",
    "NodePruneResult",
    "Sandbox",
    "SandboxNode",
    "SandboxNodeSpec",
    "SandboxNodeStatus",
    "SandboxPhase",
    "SandboxPool",
    "SandboxPoolSpec",
    "SandboxPoolStatus",
    "SandboxSpec",
    "SandboxStatus",
    "SandboxTemplate",
]
