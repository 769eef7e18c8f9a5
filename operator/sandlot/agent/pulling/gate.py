"""The image step of a start: run, pull, report the pull, back off, or fail.

``ImageGate.ready`` is asked by a start before anything else touches the image.
It applies ``ImagePulls.decide`` and says so in the sandbox's status, which stays
``Scheduled`` while the image is on its way: reason ``Pulling`` with the bytes so
far, or ``ImagePullBackOff`` with the registry's own message and when the next
try is. A status is written only when what it says changed, so a sync pass that
finds nothing new costs the API server nothing. A decision to fail raises
``PullRefused``: the sandbox ends ``Failed`` (``ErrImagePull``, or ``ImageNotFound``
under ``Never``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry

from sandlot.adapters.pulling import Credential
from sandlot.agent.pulling.pulls import ImagePulls
from sandlot.agent.settings import AgentSettings
from sandlot.agent.status import StatusWriter
from sandlot.api.common import key_of
from sandlot.api.reasons import SandboxReason
from sandlot.api.sandbox import SandboxPhase, SandboxSpec
from sandlot.api.timestamps import rfc3339
from sandlot.policy.agentsync import UNSTARTED_PHASES
from sandlot.policy.committed import start_refusal
from sandlot.policy.pulling import (
    ImageReference,
    InvalidReference,
    PullAction,
    PullPolicy,
    RegistryAccess,
    parse_reference,
    public_message,
)

log = logging.getLogger(__name__)

PROGRESS_WRITE_SECONDS = 2.0

CredentialLookup = Callable[[Mapping[str, Any], ImageReference], tuple[Credential | None, str]]
"""The credential for a sandbox's image and its identity (``policy.pulling.credentials``)."""


class ImageNotReady(Exception):
    """The image is being pulled or backing off: the start ends here, a later pass goes on."""


class PullRefused(Exception):
    """The pull policy ends the sandbox Failed with ``reason``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ImageGate:
    def __init__(
        self, pulls: ImagePulls, status: StatusWriter, credentials: CredentialLookup
    ) -> None:
        self.pulls = pulls
        self.status = status
        self._credentials = credentials
        # Progress alone is written at most every PROGRESS_WRITE_SECONDS per sandbox:
        # each write comes back as a watch event that wakes another pass.
        self._progress_written: dict[str, float] = {}
        # The pull each waiting sandbox (by uid) started or joined, for Always.
        self._joined: dict[str, int] = {}

    def check(self, sb: Mapping[str, Any], spec: SandboxSpec, committed: str | None = None) -> None:
        """Return when the image may be used now; else raise ``ImageNotReady`` (after
        saying why in the status) or ``PullRefused``. ``committed``: the start uses that
        image sandlot committed (a fork, a restore), never pulled: it must be of the
        sandbox's own namespace."""
        if committed is not None:
            labels = self.pulls.labels(committed)
            refusal = start_refusal(committed, labels, str(sb["metadata"]["namespace"]))
            if refusal is not None:
                raise PullRefused(SandboxReason.INVALID_IMAGE_NAME, refusal)
            return
        image, uid = spec.image, str(sb["metadata"]["uid"])
        try:
            ref = parse_reference(image)
        except InvalidReference as exc:
            raise PullRefused(SandboxReason.INVALID_IMAGE_NAME, str(exc)) from None
        credential, identity = self._credentials(sb, ref)
        key = (image, identity)
        decision = self.pulls.decide(key, PullPolicy(spec.image_pull_policy), self._joined.get(uid))
        if decision.action in (PullAction.RUN, PullAction.FAIL):
            self._joined.pop(uid, None)
        if decision.action is PullAction.RUN:
            return
        said = public_message(decision.message, ref.registry)  # the log has it whole
        if decision.action is PullAction.FAIL:
            raise PullRefused(decision.reason, f"image {image}: {said}")
        if decision.action in (PullAction.PULL, PullAction.VERIFY):
            verify = decision.action is PullAction.VERIFY
            self._joined[uid] = self.pulls.start(key, credential, verify=verify)
            what = "verifying its credential for" if verify else "pulling"
            log.info("sandbox %s: %s image %s", key_of(sb), what, image)
            self._report_pulling(sb, key)
        elif decision.action is PullAction.WAIT:
            self._joined.setdefault(uid, self.pulls.history(key).started)
            self._report_pulling(sb, key)
        elif decision.retry_at is not None:
            self.pulls.wake_at(decision.retry_at)
            message = (
                f"Back-off pulling image {image} until {rfc3339(decision.retry_at, 'seconds')}: "
                f"{said}"
            )
            self._report(sb, decision.reason, message, None)
        raise ImageNotReady(image)

    def _report_pulling(self, sb: Mapping[str, Any], key: tuple[str, str]) -> None:
        image = key[0]
        done, total = self.pulls.progress(key)
        message = f"pulling image {image}" + (f": {done} of {total} bytes" if total else "")
        self._report(sb, SandboxReason.PULLING, message, {"bytes": done, "totalBytes": total})

    def _report(
        self,
        sb: Mapping[str, Any],
        reason: str,
        message: str,
        progress: Mapping[str, int] | None,
    ) -> None:
        current = sb.get("status") or {}
        if (
            current.get("reason") == reason
            and current.get("message") == message
            and current.get("imagePull") == progress
        ):
            return
        key, now = key_of(sb), time.monotonic()
        recent = now - self._progress_written.get(key, 0.0) < PROGRESS_WRITE_SECONDS
        if current.get("reason") == reason and progress is not None and recent:
            return
        self._progress_written[key] = now
        if len(self._progress_written) > 4096:  # forget the long-finished ones
            cutoff = now - 60 * PROGRESS_WRITE_SECONDS
            self._progress_written = {k: t for k, t in self._progress_written.items() if t > cutoff}
        body = {
            "phase": SandboxPhase.SCHEDULED.value,
            "reason": str(reason),
            "message": message,
            "imagePull": dict(progress) if progress is not None else None,
        }
        self.status.write(sb, body, allowed_from=UNSTARTED_PHASES)


__all__ = [
    "CredentialLookup",
    "ImageGate",
    "ImageNotReady",
    "PullRefused",
    "build_image_gate",
    "registry_access",
]


def registry_access(settings: AgentSettings) -> RegistryAccess:
    """Where this agent's registry requests may go (``policy.pulling.access``)."""
    from sandlot.adapters.pulling import node_addresses

    return RegistryAccess(
        private_hosts=frozenset(settings.registry_private_hosts),
        redirect_hosts=frozenset(settings.registry_redirect_hosts),
        node_addresses=node_addresses() | ({settings.node_address} - {""}),
    )


def build_image_gate(
    settings: AgentSettings,
    api: Any,
    status: StatusWriter,
    wake: threading.Event,
    metrics_registry: CollectorRegistry,
    clock: Callable[[], datetime],
) -> tuple[ImageGate, Callable[[], None]]:
    """The gate over a containerd puller from the agent's settings, and its closer;
    credentials come from this node's brokered Secret and the node-wide default."""
    from sandlot.adapters.pulling import ContainerdPuller, endpoints_for
    from sandlot.adapters.pullsecrets import node_brokered_data
    from sandlot.agent.pulling.access import ImageAccess, access_file
    from sandlot.agent.pulling.credentials import Credentials
    from sandlot.agent.pulling.metrics import PullMetrics
    from sandlot.agent.pulling.pulls import PullOptions

    puller = ContainerdPuller(
        settings.containerd_address,
        settings.containerd_namespace,
        stall_timeout=settings.image_pull_stall_timeout.total_seconds(),
        transfer=settings.image_pull_by_daemon,
        access=registry_access(settings),
        **settings.unpacked_caps(),
    )
    access = ImageAccess(
        access_file(settings.state_dir, settings.node_name),
        settings.image_pull_credentials_verification_policy,
        settings.preloaded_images_verification_allowlist,
    )
    pulls = ImagePulls(
        lambda: puller,
        lambda ref: endpoints_for(ref, settings.registry_config_dir or None),
        PullOptions(
            deadline=settings.image_pull_deadline.total_seconds(),
            call_timeout=settings.call_timeout.total_seconds(),
            workers=settings.image_pull_workers,
            backoff=settings.image_pull_backoff,
            max_backoff=settings.image_pull_max_backoff,
        ),
        wake,
        PullMetrics(metrics_registry),
        clock,
        access,
    )
    # No identity yet (no brokered secret): the default only.
    brokered = node_brokered_data(
        api, settings.namespace, settings.node_name, what="pull credentials"
    )
    credentials = Credentials(brokered, settings.registry_auth_file)

    def close() -> None:
        pulls.close()
        puller.close()

    return ImageGate(pulls, status, credentials.resolve), close
