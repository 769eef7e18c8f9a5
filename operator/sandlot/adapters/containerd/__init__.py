"""containerd adapter: the agent's ``Runtime`` over containerd's gRPC API.

The gRPC stubs live in ``gen/``, generated at setup time by
``python -m sandlot.adapters.containerd.gen_stubs``; importing ``client`` fails
with that instruction when they are missing.
"""

from sandlot.adapters.containerd.client import ContainerdRuntime, chain_id

__all__ = ["ContainerdRuntime", "chain_id"]
