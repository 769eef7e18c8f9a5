"""containerd adapter: the agent's ``Runtime`` over containerd's gRPC API.

The gRPC stubs live in ``gen/``, generated at setup time by
``python -m sandlot.devtools.gen_stubs``; importing ``client`` fails
with that instruction when they are missing. The names below load lazily so the
package imports before the stubs exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandlot.adapters.containerd.client import ContainerdRuntime, chain_id

__all__ = ["ContainerdRuntime", "chain_id"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from sandlot.adapters.containerd import client

        return getattr(client, name)
    raise AttributeError(name)
