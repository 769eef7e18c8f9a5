"""Image pulling's I/O: the registry client (``registry``, HTTP with the address
checks of ``policy.pulling``), the registry host configuration (``hosts``), and
the puller that lands an image in containerd, either client-side (``steps``:
content, snapshots, diff) or through the daemon's Transfer service
(``transfer``), chosen per pull by ``puller``; and the push of an image from the
node's content store to a registry (``push``: a suspended sandbox's state).

Callers outside the package import from here; the modules import each other.
"""

from sandlot.adapters.pulling.hosts import endpoints_for, node_addresses
from sandlot.adapters.pulling.puller import ContainerdPuller, PullMethod
from sandlot.adapters.pulling.push import Pushed, push_image
from sandlot.adapters.pulling.registry import Credential, Endpoint, RegistryClient, RegistryError

__all__ = [
    "ContainerdPuller",
    "Credential",
    "Endpoint",
    "PullMethod",
    "Pushed",
    "RegistryClient",
    "RegistryError",
    "endpoints_for",
    "node_addresses",
    "push_image",
]
