"""The agent's record of which credential identities may use which images, kept on disk.

``policy.pulling.credentials`` decides; this module keeps the verified (image, identity)
pairs in ``<stateDir>/image-access-<node>.json`` so that they survive an agent
restart (a sandbox that was verified is not checked again for every start). The
file is written whole, through a temporary file and a rename, after each new
pair. A missing or unreadable file is an empty record: every image the agent
pulled is then verified again at its next start for a non-matching identity,
which costs a manifest request and never lets one through.

Whether an image was pulled by the agent is read from the image record itself
(``PULLED_BY_AGENT_LABEL``, set by every pull), so losing this file cannot make a
pulled image look preloaded.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandlot.api.keys import PULLED_BY_AGENT_LABEL
from sandlot.policy.pulling import (
    AccessRecords,
    InvalidReference,
    VerifyPolicy,
    needs_verification,
    parse_reference,
)

log = logging.getLogger(__name__)


def access_file(state_dir: str, node: str) -> Path:
    return Path(state_dir) / f"image-access-{node}.json"


class ImageAccess:
    def __init__(
        self, path: Path | None, policy: VerifyPolicy, allowlist: Sequence[str] = ()
    ) -> None:
        """``path`` None keeps the records in memory only (tests of the policy)."""
        self.path = path
        self.policy = policy
        self.allowlist = list(allowlist)
        self._lock = threading.Lock()
        self._records = self._load()

    def _load(self) -> AccessRecords:
        if self.path is None or not self.path.exists():
            return AccessRecords()
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            log.warning("image access records %s unreadable (%s): starting empty", self.path, exc)
            return AccessRecords()
        return AccessRecords.from_json(doc if isinstance(doc, dict) else {})

    def needs_verification(
        self, image: str, identity: str, labels: Mapping[str, str] | None
    ) -> bool:
        """Whether ``identity`` must verify before running ``image`` (present on the node
        with ``labels``)."""
        try:
            repository = parse_reference(image).name
        except InvalidReference:
            repository = image
        with self._lock:
            verified = self._records.verified(image)
        return needs_verification(
            self.policy,
            identity=identity,
            verified=verified,
            pulled_by_agent=labels is None or PULLED_BY_AGENT_LABEL in labels,
            repository=repository,
            allowlist=self.allowlist,
        )

    def record(self, image: str, identity: str) -> None:
        """``identity`` was seen to reach ``image`` (a pull or a verification)."""
        with self._lock:
            if not self._records.record(image, identity):
                return
            doc = self._records.to_json()
            if self.path is None:
                return
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(doc))
                os.replace(tmp, self.path)
            except OSError as exc:  # the pair still holds in memory; a restart re-verifies
                log.warning("image access records %s not saved: %s", self.path, exc)


__all__ = ["ImageAccess", "access_file"]
