"""agent-sandbox's face: its warm pools and claims served by sandlot's own.

No second controller stack: a SandboxWarmPool becomes a sandlot SandboxPool of its
name (its template translated by ``policy.agentsandbox``), which the pool
controller keeps; a SandboxClaim becomes a sandlot SandboxClaim of its name, which
the claim controller binds to a warm member at once. This controller only
translates and reports: the agent-sandbox claim's ``status.sandbox`` and ``Ready``
condition, and an ``agents.x-k8s.io`` Sandbox mirroring the claimed sandbox (its
Ready condition and address), written before the claim says Ready, since its client
reads the Sandbox the moment the claim is Ready.

What sandlot makes is owned by what asked for it (ownerReferences: the garbage
collector deletes it with its owner), and deleted here too on the owner's DELETED
event, so deleting a claim removes its sandbox on a control plane without a
collector as well. A refusal is the claim's Ready=False with agent-sandbox's reason
and the field; nothing is created for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kopf

from sandlot.adapters.agentsandboxapi import (
    CLAIM,
    COMPAT_CLAIM,
    MIRROR,
    POOL,
    TEMPLATE,
    WARM_POOL,
    AgentSandboxApi,
    Kind,
)
from sandlot.api.agentsandbox import (
    AGENT_SANDBOX_VERSION,
    AGENTS_API_VERSION,
    COMPAT_CLAIMS,
    EXTENSIONS_API_VERSION,
    EXTENSIONS_GROUP,
    TEMPLATES,
    WARM_POOLS,
)
from sandlot.api.common import (
    API_VERSION,
    CLAIMS,
    GROUP,
    POOLS,
    VERSION,
    Condition,
    controller_reference,
    join_key,
    split_key,
)
from sandlot.api.keys import AGENT_SANDBOX_SPEC_ANNOTATION
from sandlot.api.reasons import AgentSandboxReason as Reason
from sandlot.api.reasons import ConditionType
from sandlot.api.timestamps import utcnow
from sandlot.controllers.kopfhandlers import OnEvent, forward_events
from sandlot.controllers.sandboxes import SandboxCache, SandboxRecord
from sandlot.controllers.workqueue import WorkQueue
from sandlot.policy.agentsandbox import (
    ClaimView,
    Refusal,
    SandboxView,
    check_claim,
    claim_view,
    differs,
    ends_by_deletion,
    owned_by,
    sandlot_claim_spec,
    spec_hash,
    translate_template,
    warm_pool_spec,
    warm_pool_status,
)
from sandlot.policy.conditions import parse_conditions, set_condition, wire_conditions

log = logging.getLogger(__name__)

RETRY_AFTER_ERROR = 0.5
RETRY_CAP = 30.0
WORKERS = 8


def _owner(api_version: str, kind: str, body: Mapping[str, Any]) -> dict[str, Any]:
    meta = body["metadata"]
    return controller_reference(
        api_version, kind, meta["name"], meta["uid"], block_owner_deletion=False
    )


@dataclass(frozen=True)
class Released:
    """An owner deleted: what was made for it goes too (uid-guarded)."""

    uid: str
    sandbox: str = ""


class AgentSandboxController:
    def __init__(
        self,
        api: AgentSandboxApi,
        cache: SandboxCache,
        *,
        is_leader: Callable[[], bool],
        clock: Callable[[], datetime] = utcnow,
        queue_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        self.templates: dict[str, dict[str, Any]] = {}
        self.warm_pools: dict[str, dict[str, Any]] = {}
        self.claims: dict[str, dict[str, Any]] = {}
        self.pools: dict[str, dict[str, Any]] = {}  # sandlot pools
        self.sandlot_claims: dict[str, dict[str, Any]] = {}
        self._released_pools: dict[str, Released] = {}
        self._released_claims: dict[str, Released] = {}
        self._mirrors: dict[str, dict[str, Any]] = {}  # as last written here

        def queue(name: str, reconcile: Callable[[str], Any]) -> WorkQueue:
            return WorkQueue(
                name,
                reconcile,
                is_leader=is_leader,
                clock=queue_clock,
                backoff_start=RETRY_AFTER_ERROR,
                backoff_cap=RETRY_CAP,
            )

        self.pool_queue = queue("agent-sandbox-pool", self.reconcile_pool)
        self.claim_queue = queue("agent-sandbox-claim", self.reconcile_claim)
        cache.listeners.append(self.on_sandbox)

    # -- inputs ---------------------------------------------------------------------

    def _store(self, into: dict[str, dict[str, Any]], event: str | None, body: Any) -> str:
        meta = body["metadata"]
        key = join_key(meta["namespace"], meta["name"])
        if event == "DELETED":
            into.pop(key, None)
        else:
            into[key] = dict(body)
        return key

    def on_template(self, event: str | None, body: Mapping[str, Any]) -> None:
        self._store(self.templates, event, body)
        namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
        for pool_key, pool in self.warm_pools.items():
            if pool["metadata"]["namespace"] == namespace and self._template_name(pool) == name:
                self.pool_queue.add(pool_key)
                self._claims_of_pool(namespace, pool["metadata"]["name"])

    def on_warm_pool(self, event: str | None, body: Mapping[str, Any]) -> None:
        key = self._store(self.warm_pools, event, body)
        if event == "DELETED":
            self._released_pools[key] = Released(body["metadata"]["uid"])
        self.pool_queue.add(key)
        self._claims_of_pool(body["metadata"]["namespace"], body["metadata"]["name"])

    def on_claim(self, event: str | None, body: Mapping[str, Any]) -> None:
        key = self._store(self.claims, event, body)
        if event == "DELETED":
            sandbox = ((body.get("status") or {}).get("sandbox") or {}).get("name") or ""
            self._released_claims[key] = Released(body["metadata"]["uid"], sandbox)
        self.claim_queue.add(key)

    def on_pool(self, event: str | None, body: Mapping[str, Any]) -> None:
        key = self._store(self.pools, event, body)
        if key in self.warm_pools:
            self.pool_queue.add(key)

    def on_sandlot_claim(self, event: str | None, body: Mapping[str, Any]) -> None:
        key = self._store(self.sandlot_claims, event, body)
        if key in self.claims:
            self.claim_queue.add(key)

    def on_sandbox(self, old: SandboxRecord | None, new: SandboxRecord | None) -> None:
        for rec in (old, new):
            if rec is not None and rec.claim is not None:
                key = join_key(rec.namespace, rec.claim)
                if key in self.claims:
                    self.claim_queue.add(key)

    def _claims_of_pool(self, namespace: str, pool: str) -> None:
        for key, claim in self.claims.items():
            spec = claim.get("spec") or {}
            ref = (spec.get("warmPoolRef") or {}).get("name")
            if claim["metadata"]["namespace"] == namespace and ref == pool:
                self.claim_queue.add(key)

    @staticmethod
    def _template_name(pool: Mapping[str, Any]) -> str:
        return str(((pool.get("spec") or {}).get("sandboxTemplateRef") or {}).get("name") or "")

    def enqueue_all(self) -> None:
        self.pool_queue.add_all(list(self.warm_pools))
        self.claim_queue.add_all(list(self.claims))

    async def run(self) -> None:
        await asyncio.gather(
            self.pool_queue.run(workers=WORKERS), self.claim_queue.run(workers=WORKERS)
        )

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def _read(
        self, cached: dict[str, dict[str, Any]], kind: Kind, namespace: str, name: str
    ) -> dict[str, Any] | None:
        """From the cache, else from the API server: a claim made right after its
        pool must not be refused because the pool's event is still on its way."""
        body = cached.get(join_key(namespace, name))
        if body is None:
            body = await self._call(self.api.get, kind, namespace, name)
        return body

    # -- warm pools -----------------------------------------------------------------

    async def reconcile_pool(self, key: str) -> float | None:
        released = self._released_pools.pop(key, None)
        pool = self.pools.get(key)
        if released is not None and owned_by(pool, released.uid) and pool is not None:
            namespace, name = pool["metadata"]["namespace"], pool["metadata"]["name"]
            await self._call(self.api.delete, POOL, namespace, name, pool["metadata"]["uid"])
        warm = self.warm_pools.get(key)
        if warm is None:
            return None
        namespace, name = warm["metadata"]["namespace"], warm["metadata"]["name"]
        template = await self._read(self.templates, TEMPLATE, namespace, self._template_name(warm))
        translated = (
            translate_template(template.get("spec") or {})
            if template is not None
            else Refusal(Reason.TEMPLATE_NOT_FOUND, f"SandboxTemplate {self._template_name(warm)}")
        )
        if isinstance(translated, Refusal):
            await self._pool_status(warm, pool, translated)
            return None
        wanted = warm_pool_spec(translated, int((warm.get("spec") or {}).get("replicas", 1)))
        digest = spec_hash(wanted)
        if pool is None:
            pool = await self._call(
                self.api.create,
                POOL,
                namespace,
                {
                    "apiVersion": API_VERSION,
                    "kind": "SandboxPool",
                    "metadata": {
                        "name": name,
                        "annotations": {AGENT_SANDBOX_SPEC_ANNOTATION: digest},
                        "ownerReferences": [
                            _owner(EXTENSIONS_API_VERSION, "SandboxWarmPool", warm)
                        ],
                    },
                    "spec": wanted,
                },
            )
            if pool is None:
                pool = await self._call(self.api.get, POOL, namespace, name)
        if pool is not None and not owned_by(pool, warm["metadata"]["uid"]):
            taken = Refusal(
                Reason.INVALID_CONFIGURATION,
                f"metadata.name: a sandlot SandboxPool {name} exists and is not this warm pool's",
            )
            await self._pool_status(warm, None, taken)
            return None
        annotations = ((pool or {}).get("metadata") or {}).get("annotations") or {}
        if pool is not None and annotations.get(AGENT_SANDBOX_SPEC_ANNOTATION) != digest:
            fields = {
                f"/metadata/annotations/{AGENT_SANDBOX_SPEC_ANNOTATION.replace('/', '~1')}": digest,
                "/spec/replicas": wanted["replicas"],
                "/spec/template": wanted["template"],
            }
            uid = pool["metadata"]["uid"]
            pool = await self._call(self.api.replace_fields, POOL, namespace, name, uid, fields)
        await self._pool_status(warm, pool, None)
        return None

    async def _pool_status(
        self, warm: Mapping[str, Any], pool: Mapping[str, Any] | None, refusal: Refusal | None
    ) -> None:
        current = dict(warm.get("status") or {})
        wanted = warm_pool_status((pool or {}).get("status"))
        ready = (
            Condition(type=ConditionType.READY, status="True", reason=Reason.SANDBOX_READY)
            if refusal is None
            else Condition(
                type=ConditionType.READY,
                status="False",
                reason=refusal.reason,
                message=refusal.message,
            )
        )
        conditions = set_condition(parse_conditions(current.get("conditions")), ready, self.clock())
        wanted["conditions"] = wire_conditions(conditions)
        if differs(current, wanted):
            meta = warm["metadata"]
            written = await self._call(
                self.api.patch_status, WARM_POOL, meta["namespace"], meta["name"], wanted
            )
            if (
                written is not None
                and self.warm_pools.get(join_key(meta["namespace"], meta["name"])) is warm
            ):
                self.warm_pools[join_key(meta["namespace"], meta["name"])] = written

    # -- claims ---------------------------------------------------------------------

    async def reconcile_claim(self, key: str) -> float | None:
        released = self._released_claims.pop(key, None)
        if released is not None:
            await self._release(key, released)
        claim = self.claims.get(key)
        if claim is None:
            return None
        meta, spec = claim["metadata"], claim.get("spec") or {}
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        if meta.get("deletionTimestamp"):
            return None
        sandlot_claim = self.sandlot_claims.get(key)
        bound_before = ((claim.get("status") or {}).get("sandbox") or {}).get("name")
        if sandlot_claim is None and bound_before:
            sandlot_claim = await self._call(self.api.get, CLAIM, namespace, name)
            if sandlot_claim is None:
                return await self._gone(claim, spec)
        if sandlot_claim is None:
            refusal = await self._check(namespace, spec)
            if refusal is not None:
                await self._claim_status(claim, ClaimView(False, refusal.reason, refusal.message))
                return None
            sandlot_claim = await self._call(
                self.api.create,
                CLAIM,
                namespace,
                {
                    "apiVersion": API_VERSION,
                    "kind": "SandboxClaim",
                    "metadata": {
                        "name": name,
                        "ownerReferences": [_owner(EXTENSIONS_API_VERSION, "SandboxClaim", claim)],
                    },
                    "spec": sandlot_claim_spec(spec),
                },
            )
            if sandlot_claim is None:  # the name was taken: by this claim before a restart?
                sandlot_claim = await self._call(self.api.get, CLAIM, namespace, name)
        if sandlot_claim is not None and not owned_by(sandlot_claim, uid):
            message = f"metadata.name: a sandlot SandboxClaim {name} exists and is not this claim's"
            await self._claim_status(claim, ClaimView(False, Reason.INVALID_CONFIGURATION, message))
            return None
        status = (sandlot_claim or {}).get("status")
        view = claim_view(status, self._sandbox(namespace, (status or {}).get("sandboxName")))
        if view.sandbox:
            await self._mirror(claim, view)
        await self._claim_status(claim, view)
        return None

    async def _check(self, namespace: str, spec: Mapping[str, Any]) -> Refusal | None:
        pool_name = (spec.get("warmPoolRef") or {}).get("name") or ""
        warm = await self._read(self.warm_pools, WARM_POOL, namespace, pool_name)
        if warm is None:
            return Refusal(Reason.WARM_POOL_NOT_FOUND, f"SandboxWarmPool {pool_name}")
        template_name = self._template_name(warm)
        template = await self._read(self.templates, TEMPLATE, namespace, template_name)
        if template is None:
            return Refusal(Reason.TEMPLATE_NOT_FOUND, f"SandboxTemplate {template_name}")
        template_spec = template.get("spec") or {}
        translated = translate_template(template_spec)
        if isinstance(translated, Refusal):
            return translated
        return check_claim(spec, template_spec)

    def _sandbox(self, namespace: str, name: str | None) -> SandboxView | None:
        rec = self.cache.get(join_key(namespace, name)) if name else None
        if rec is None:
            return None
        return SandboxView(rec.name, rec.phase, rec.ready, rec.paused, rec.ip, rec.node)

    async def _gone(self, claim: Mapping[str, Any], spec: Mapping[str, Any]) -> float | None:
        """Its sandlot claim is gone after it was bound: deleted by its lifecycle (then
        so is this claim), or by someone else (this claim is lost: never bound again)."""
        meta = claim["metadata"]
        if ends_by_deletion(spec, self.clock()):
            await self._call(
                self.api.delete, COMPAT_CLAIM, meta["namespace"], meta["name"], meta["uid"]
            )
            log.info("agent-sandbox claim %s: deleted at its shutdownTime", meta["name"])
            return None
        name = ((claim.get("status") or {}).get("sandbox") or {}).get("name") or ""
        view = ClaimView(False, Reason.POD_FAILED, f"sandbox {name} was deleted", name)
        await self._claim_status(claim, view)
        return None

    async def _release(self, key: str, released: Released) -> None:
        sandlot_claim = self.sandlot_claims.get(key)
        namespace, name = split_key(key)
        if sandlot_claim is None:
            sandlot_claim = await self._call(self.api.get, CLAIM, namespace, name)
        if sandlot_claim is not None and owned_by(sandlot_claim, released.uid):
            await self._call(
                self.api.delete, CLAIM, namespace, name, sandlot_claim["metadata"]["uid"]
            )
            log.info("agent-sandbox claim %s deleted: deleted its sandlot claim", key)
        if released.sandbox:
            self._mirrors.pop(join_key(namespace, released.sandbox), None)
            mirror = await self._call(self.api.get, MIRROR, namespace, released.sandbox)
            if mirror is not None and owned_by(mirror, released.uid):
                await self._call(
                    self.api.delete, MIRROR, namespace, released.sandbox, mirror["metadata"]["uid"]
                )

    async def _mirror(self, claim: Mapping[str, Any], view: ClaimView) -> None:
        """The agents.x-k8s.io Sandbox the client reads: created once, its status kept.
        What this controller last wrote of it is remembered, so a claim's path to Ready
        costs no read of it."""
        meta = claim["metadata"]
        namespace = meta["namespace"]
        key = join_key(namespace, view.sandbox)
        mirror = self._mirrors.get(key)
        if mirror is None:
            extra = (claim.get("spec") or {}).get("additionalPodMetadata") or {}
            body = {
                "apiVersion": AGENTS_API_VERSION,
                "kind": "Sandbox",
                "metadata": {
                    "name": view.sandbox,
                    "labels": dict(extra.get("labels") or {}),
                    "annotations": dict(extra.get("annotations") or {}),
                    "ownerReferences": [_owner(EXTENSIONS_API_VERSION, "SandboxClaim", claim)],
                },
                "spec": {"replicas": 1},
            }
            mirror = await self._call(self.api.create, MIRROR, namespace, body)
            if mirror is None:  # there already (made before a restart, or someone's)
                mirror = await self._call(self.api.get, MIRROR, namespace, view.sandbox)
            if mirror is None:
                return
        if not owned_by(mirror, meta["uid"]):
            return
        current = dict(mirror.get("status") or {})
        conditions = set_condition(
            parse_conditions(current.get("conditions")), self._ready(view), self.clock()
        )
        rec = self.cache.get(key)
        wanted = {
            "conditions": wire_conditions(conditions),
            "podIPs": list(view.pod_ips),
            "replicas": 1 if view.ready else 0,
            "nodeName": rec.node if rec is not None else None,
        }
        if differs(current, wanted):
            written = await self._call(
                self.api.patch_status, MIRROR, namespace, view.sandbox, wanted
            )
            mirror = written if written is not None else mirror
        self._mirrors[key] = mirror

    @staticmethod
    def _ready(view: ClaimView) -> Condition:
        return Condition(
            type=ConditionType.READY,
            status="True" if view.ready else "False",
            reason=view.reason,
            message=view.message,
        )

    async def _claim_status(self, claim: Mapping[str, Any], view: ClaimView) -> None:
        current = dict(claim.get("status") or {})
        conditions = set_condition(
            parse_conditions(current.get("conditions")), self._ready(view), self.clock()
        )
        wanted: dict[str, Any] = {"conditions": wire_conditions(conditions)}
        if view.sandbox:
            wanted["sandbox"] = {"name": view.sandbox, "podIPs": list(view.pod_ips)}
        if not differs(current, wanted):
            return
        meta = claim["metadata"]
        key = join_key(meta["namespace"], meta["name"])
        written = await self._call(
            self.api.patch_status, COMPAT_CLAIM, meta["namespace"], meta["name"], wanted
        )
        if written is not None and self.claims.get(key) is claim:
            self.claims[key] = written
        if view.ready or view.final:
            log.info("agent-sandbox claim %s: %s %s", key, view.reason, view.message)


def register(registry: kopf.OperatorRegistry, controller: AgentSandboxController) -> None:
    """Watch-only handlers: agent-sandbox's kinds, and sandlot's pools and claims
    (kopf serves both handlers of a kind from one watch)."""
    extensions = (EXTENSIONS_GROUP, AGENT_SANDBOX_VERSION)
    watched: tuple[tuple[str, tuple[str, str, str], OnEvent], ...] = (
        ("template_event", (*extensions, TEMPLATES), controller.on_template),
        ("warm_pool_event", (*extensions, WARM_POOLS), controller.on_warm_pool),
        ("compat_claim_event", (*extensions, COMPAT_CLAIMS), controller.on_claim),
        ("agent_sandbox_pool_event", (GROUP, VERSION, POOLS), controller.on_pool),
        ("agent_sandbox_claim_event", (GROUP, VERSION, CLAIMS), controller.on_sandlot_claim),
    )
    for name, resource, on_event in watched:
        forward_events(registry, resource, on_event, name=name)
