"""Everything sandlot takes from kopf's private API, in one place.

kopf has no public hook for two things the operator needs on a large fleet:
telling its per-object memory to forget the kinds only ``on.event`` watches, and
reading which sorts of handlers the registry holds for a kind. Both live under
``kopf._cogs`` / ``kopf._core`` and on underscored registry attributes, which kopf
may move in any minor release. So they are used here and nowhere else (an
import-linter contract forbids ``kopf._*`` in every other sandlot module), kopf is
pinned to the minor release this was tested against, and a unit test reads this
module's source for every private name it uses and checks each against the
installed kopf, so an upgrade that moves one fails that test with the reason
instead of failing the operator at runtime.
"""

from __future__ import annotations

from collections.abc import Collection

import kopf
from kopf._cogs.structs.ephemera import AnyMemo
from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory

from sandlot.api.common import GROUP, VERSION
from sandlot.api.crdgen import KINDS


class WatchOnlyMemories(ResourceMemories):
    """kopf's per-object memories, minus the objects nothing but ``on.event`` watches.

    kopf keeps a record for every object it has seen until that object's DELETED
    event: a memo, an error throttler, index and daemon bookkeeping, memory that
    grows with the fleet. Only timers, daemons, change handlers and indexes ever
    read it again; a kind watched by ``on.event`` alone gets a fresh record per
    event instead (kopf's own "ephemeral" memory, which it uses for admission
    requests), and nothing is kept. ``watch_only_kinds`` decides which
    kinds qualify from the registry itself, so a timer added to one of them later
    takes it off the list instead of breaking.
    """

    def __init__(self, kinds: Collection[str]) -> None:
        super().__init__()
        self.kinds = frozenset(kinds)

    async def recall(
        self,
        raw_body: kopf.RawBody,
        *,
        memobase: AnyMemo | None = None,
        noticed_by_listing: bool = False,
        ephemeral: bool = False,
    ) -> ResourceMemory:
        if raw_body.get("kind") in self.kinds and str(raw_body.get("apiVersion", "")).startswith(
            f"{GROUP}/"
        ):
            ephemeral = True
        return await super().recall(
            raw_body,
            memobase=memobase,
            noticed_by_listing=noticed_by_listing,
            ephemeral=ephemeral,
        )


def watch_only_kinds(registry: kopf.OperatorRegistry) -> frozenset[str]:
    """Our kinds that ``on.event`` handlers watch and no handler of any other sort does."""
    others = (registry._indexing, registry._spawning, registry._changing, registry._webhooks)
    kinds = set()
    for model in KINDS:
        crd = model.crd
        resource = kopf.Resource(
            GROUP,
            VERSION,
            crd.plural,
            kind=crd.kind,
            singular=crd.singular,
            shortcuts=frozenset(crd.short_names),
            namespaced=crd.scope == "Namespaced",
        )
        if registry._watching.has_handlers(resource) and not any(
            r.has_handlers(resource) for r in others
        ):
            kinds.add(crd.kind)
    return frozenset(kinds)


__all__ = ["WatchOnlyMemories", "watch_only_kinds"]
