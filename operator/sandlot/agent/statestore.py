"""A suspended sandbox's state off its node: sealed and pushed after the commit,
pulled back and opened on whichever node starts it again.

The repository is the agent's ``suspend_state_repository``; each sandbox's state
is its tag there (the Sandbox's uid; a snapshot's ``snapshot-<uid>``), and the
status records the exact ``repository:tag@digest`` pushed, which is what a
restore pulls. Every state is sealed under its owner's key
(``adapters.pulling.sealed``): the operator brokers to this node the keys of what
it runs now (``policy.statekeys``), read from the node's brokered Secret as its
own identity, so the repository credential every agent holds (push and pull,
from ``suspend_state_auth_file``; deleting is the operator's) reads nothing but
ciphertext of any other node's sandboxes. No tenant's pull secret is ever used
for a state. Every request is bounded (``RegistryClient``: stall timeout and one
deadline for the whole push or pull).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling import (
    Credential,
    Pushed,
    RegistryClient,
    RegistryError,
    endpoints_for,
)
from sandlot.adapters.pulling.sealed import SealedPuller, push_sealed
from sandlot.adapters.pullsecrets import BrokeredData, node_brokered_data
from sandlot.adapters.runtime import Runtime, RuntimeTimeout
from sandlot.agent.pulling import registry_access
from sandlot.agent.settings import AgentSettings
from sandlot.policy.pulling import (
    FailureKind,
    ImageReference,
    InvalidReference,
    credential_for,
    parse_reference,
)
from sandlot.policy.statekeys import brokered_key

log = logging.getLogger(__name__)


Keys = Callable[[str], bytes | None]
"""The state key of an owner (a sandbox's or snapshot's uid) brokered to this node."""


def brokered_keys(brokered: BrokeredData) -> Keys:
    """``Keys`` from this node's brokered Secret (read at each use: a key follows its
    sandbox to the node it moves to, and leaves the one it left)."""

    def key_of(owner: str) -> bytes | None:
        value = (brokered() or {}).get(brokered_key(owner))
        return base64.b64decode(value) if value else None

    return key_of


class StateStore:
    """Seals and pushes, pulls and opens suspended state for one agent."""

    def __init__(self, settings: AgentSettings, rt: Runtime, keys: Keys) -> None:
        self.settings, self.rt, self.keys = settings, rt, keys
        self.deadline = settings.image_pull_deadline.total_seconds()
        self.repository = parse_reference(settings.suspend_state_repository)

    @classmethod
    def from_settings(cls, settings: AgentSettings, rt: Runtime, objects: Any) -> StateStore | None:
        """The store the settings name, its keys read through ``objects``' API client as
        the node's own identity; None when state stays on its node."""
        if not settings.suspend_state_repository:
            return None
        brokered = node_brokered_data(objects.api, settings.namespace, settings.node_name)
        return cls(settings, rt, brokered_keys(brokered))

    def key(self, owner: str) -> bytes:
        """``owner``'s state key; ``RegistryError`` (one that may pass: the operator
        brokers it when the node needs it) while this node holds none."""
        key = self.keys(owner)
        if key is None:
            raise RegistryError(
                f"no state key of {owner} brokered to this node (yet)", FailureKind.TRANSIENT
            )
        return key

    def has_key(self, owner: str) -> bool:
        return self.keys(owner) is not None

    def _credential(self, registry: str) -> Credential | None:
        path = self.settings.suspend_state_auth_file
        if not path:
            return None
        try:
            document = json.loads(Path(path).read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("suspended state credential %s unreadable: %s", path, exc)
            return None
        found = credential_for(registry, [document] if isinstance(document, dict) else [])
        return Credential(*found) if found is not None else None

    def _client(self, ref: ImageReference, deadline: Deadline) -> RegistryClient:
        endpoint = endpoints_for(ref, self.settings.registry_config_dir or None)[-1]
        return RegistryClient(
            endpoint,
            ref.repository,
            self._credential(ref.registry),
            connect_timeout=self.settings.call_timeout.total_seconds(),
            stall_timeout=self.settings.image_pull_stall_timeout.total_seconds(),
            deadline=deadline,
            access=registry_access(self.settings),
        )

    def push(self, owner: str, tag: str, image: str) -> Pushed:
        """Local image ``image`` sealed under ``owner``'s key and pushed as ``tag``;
        raises ``RegistryError``, ``RuntimeError_`` or ``RuntimeTimeout``."""
        key = self.key(owner)
        deadline = Deadline(self.deadline, expired=RuntimeTimeout)
        manifest, media_type = self.rt.image_manifest(image, timeout=deadline.remaining("manifest"))

        def open_blob(digest: str) -> Iterator[bytes]:
            return self.rt.open_blob(digest, timeout=deadline.remaining(f"blob {digest}"))

        client = self._client(self.repository, deadline)
        try:
            pushed = push_sealed(client, tag, manifest, media_type, open_blob, key)
        finally:
            client.close()
        # Named as the repository is (docker.io, not the endpoint's host): what a pull
        # on any node resolves through its own endpoints and mirrors.
        repo = f"{self.repository.registry}/{self.repository.repository}"
        return replace(pushed, reference=f"{repo}:{tag}@{pushed.digest}")

    def pull(self, reference: str, image: str, owner: str) -> None:
        """The pushed ``reference`` of ``owner`` pulled into this node's store as
        ``image``, opened with its key (none here: ``RegistryError``)."""
        try:
            ref = parse_reference(reference)
        except InvalidReference as exc:
            raise RegistryError(f"suspended state {reference!r}: {exc}") from exc
        if (ref.registry, ref.repository) != (self.repository.registry, self.repository.repository):
            raise RegistryError(f"{reference} is not in this node's state repository")
        key = self.key(owner)
        puller = SealedPuller(
            self.settings.containerd_address,
            self.settings.containerd_namespace,
            stall_timeout=self.settings.image_pull_stall_timeout.total_seconds(),
            transfer=False,
            access=registry_access(self.settings),
            **self.settings.unpacked_caps(),
        )
        try:
            puller.pull_sealed(
                image,
                ref,
                endpoints_for(ref, self.settings.registry_config_dir or None),
                self._credential(ref.registry),
                key,
                deadline=self.deadline,
            )
        finally:
            puller.close()


__all__ = ["Keys", "StateStore", "brokered_keys"]
