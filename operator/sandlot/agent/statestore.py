"""A suspended sandbox's state off its node: pushed after the commit, pulled back
on whichever node starts it again.

The repository is the agent's ``suspend_state_repository``; each sandbox's state
is its tag there (the Sandbox's uid), and the status records the exact
``repository:tag@digest`` pushed, which is what a restore pulls. The credential
is the platform's, read from ``suspend_state_auth_file`` (a ``.dockerconfigjson``
the chart mounts from one Secret into every agent, as the node-wide default pull
credential is): it is used for that registry and that repository only, never for
a sandbox's own image, and no tenant's pull secret is ever used for a state.
Since every agent holds it, the registry should grant it that repository alone.
Every request is bounded (``RegistryClient``: stall timeout and one deadline for
the whole push or pull).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from sandlot.adapters.deadline import Deadline
from sandlot.adapters.pulling import (
    ContainerdPuller,
    Credential,
    Pushed,
    RegistryClient,
    RegistryError,
    endpoints_for,
    push_image,
)
from sandlot.adapters.runtime import Runtime, RuntimeTimeout
from sandlot.agent.pulling import registry_access
from sandlot.agent.settings import AgentSettings
from sandlot.policy.pulling import (
    ImageReference,
    InvalidReference,
    credential_for,
    parse_reference,
)

log = logging.getLogger(__name__)


class StateStore:
    """Pushes and pulls suspended state for one agent."""

    def __init__(self, settings: AgentSettings, rt: Runtime) -> None:
        self.settings, self.rt = settings, rt
        self.deadline = settings.image_pull_deadline.total_seconds()
        self.repository = parse_reference(settings.suspend_state_repository)
        self._no_deletes: set[str] = set()  # repositories that answered a delete with 405

    @classmethod
    def from_settings(cls, settings: AgentSettings, rt: Runtime) -> StateStore | None:
        """The store the settings name; None when state stays on its node."""
        if not settings.suspend_state_repository:
            return None
        return cls(settings, rt)

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

    def push(self, uid: str, image: str) -> Pushed:
        """Local image ``image`` pushed under tag ``uid``; raises ``RegistryError``,
        ``RuntimeError_`` or ``RuntimeTimeout``."""
        deadline = Deadline(self.deadline, expired=RuntimeTimeout)
        manifest, media_type = self.rt.image_manifest(image, timeout=deadline.remaining("manifest"))

        def open_blob(digest: str) -> Iterator[bytes]:
            return self.rt.open_blob(digest, timeout=deadline.remaining(f"blob {digest}"))

        client = self._client(self.repository, deadline)
        try:
            pushed = push_image(client, uid, manifest, media_type, open_blob)
        finally:
            client.close()
        # Named as the repository is (docker.io, not the endpoint's host): what a pull
        # on any node resolves through its own endpoints and mirrors.
        repo = f"{self.repository.registry}/{self.repository.repository}"
        return replace(pushed, reference=f"{repo}:{uid}@{pushed.digest}")

    def forget(self, reference: str) -> None:
        """Delete the pushed state ``reference`` (``repo:tag@digest``) from its
        registry, once nothing needs it; raises ``RegistryError``, ``RuntimeTimeout``
        or ``InvalidReference``. A repository that does not delete (405) is said once
        and left alone from then on."""
        ref = parse_reference(reference)
        where = f"{ref.registry}/{ref.repository}"
        if not ref.digest or where in self._no_deletes:
            return
        deadline = Deadline(self.settings.call_timeout.total_seconds() * 4, expired=RegistryError)
        client = self._client(ref, deadline)
        try:
            deleted = client.delete_manifest(ref.digest)
        finally:
            client.close()
        if not deleted:
            self._no_deletes.add(where)
            log.warning(
                "state repository %s does not delete manifests (405): pushed states stay there",
                where,
            )
        else:
            log.info("pushed state %s deleted", reference)

    def pull(self, reference: str, image: str) -> None:
        """The pushed ``reference`` pulled into this node's store as ``image``."""
        try:
            ref = parse_reference(reference)
        except InvalidReference as exc:
            raise RegistryError(f"suspended state {reference!r}: {exc}") from exc
        if (ref.registry, ref.repository) != (self.repository.registry, self.repository.repository):
            raise RegistryError(f"{reference} is not in this node's state repository")
        puller = ContainerdPuller(
            self.settings.containerd_address,
            self.settings.containerd_namespace,
            stall_timeout=self.settings.image_pull_stall_timeout.total_seconds(),
            transfer=False,
            access=registry_access(self.settings),
            **self.settings.unpacked_caps(),
        )
        try:
            puller.pull(
                image,
                ref,
                endpoints_for(ref, self.settings.registry_config_dir or None),
                self._credential(ref.registry),
                deadline=self.deadline,
                labels={},
            )
        finally:
            puller.close()


__all__ = ["StateStore"]
