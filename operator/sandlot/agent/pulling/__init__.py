"""The agent's image pulls: the gate a start passes before it touches an image
(``gate``: run, pull, report the pull in the status, back off or fail), the pulls
in flight shared by every sandbox of one image and credential (``pulls``), the
credentials a pull uses (``credentials``), the record of which credential
reached which image on this node (``access``), and the pull metrics
(``metrics``).

Callers outside the package import from here; the modules import each other.
"""

from sandlot.agent.pulling.gate import (
    ImageGate,
    ImageNotReady,
    PullRefused,
    build_image_gate,
    registry_access,
)
from sandlot.agent.pulling.metrics import PullMetrics
from sandlot.agent.pulling.pulls import ImagePulls, PullOptions

__all__ = [
    "ImageGate",
    "ImageNotReady",
    "ImagePulls",
    "PullMetrics",
    "PullOptions",
    "PullRefused",
    "build_image_gate",
    "registry_access",
]
