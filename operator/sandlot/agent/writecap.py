"""Each new container's writable layer capped at its sandbox's ephemeral-storage
limit by the filesystem, where the filesystem can (``adapters.writequota``).

A cap that cannot be set never fails a start: the measurement
(``agent.ephemeralstorage``) still stops the sandbox past its limit, later. Where
the node's filesystem cannot hold caps at all, that is said once and not tried
again; a single container that cannot be capped (its upper directory a copied root
filesystem, under a user namespace) is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from sandlot.adapters.runtime import Runtime, RuntimeError_, RuntimeTimeout
from sandlot.adapters.writequota import LayerNotEmpty, QuotaUnavailable, cap_writes
from sandlot.policy.ephemeralstorage import limit_of, write_cap

log = logging.getLogger(__name__)


class WriteCaps:
    """Caps new containers' writes on ``rt``'s snapshots."""

    def __init__(self, rt: Runtime, call_timeout: float) -> None:
        self.rt = rt
        self.call_timeout = call_timeout
        self.unavailable: str | None = None
        """Why the node's filesystem holds no caps, once found; None until then."""
        self.capped = 0

    def apply(self, container_id: str, labels: Mapping[str, str]) -> bool:
        """Cap ``container_id``'s writable layer at the limit its labels carry; whether
        a cap now holds it."""
        limit = limit_of(labels)
        if limit is None or self.unavailable is not None:
            return False
        try:
            upper = self.rt.writable_layer(container_id, timeout=self.call_timeout)
            cap_writes(upper, write_cap(limit))
        except LayerNotEmpty as exc:
            log.info("container %s: writes measured, not capped: %s", container_id, exc)
            return False
        except QuotaUnavailable as exc:
            self.unavailable = str(exc)
            log.info("writable layers are measured, not capped, on this node: %s", exc)
            return False
        except (OSError, RuntimeError_, RuntimeTimeout) as exc:
            log.warning("container %s: writes not capped: %s", container_id, exc)
            return False
        self.capped += 1
        return True


__all__ = ["WriteCaps"]
