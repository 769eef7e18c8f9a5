"""Whether an image on the node may run for a sandbox's credential: pure decisions.

Kubernetes' KEP-2535 ("ensure secret pulled images"): an image pulled with one
tenant's credential is private to whoever may pull it. A sandbox runs an image the
node has only when its own credential identity (or anonymous access) has been seen
to work for that image: by a pull it made, or by a verification (one manifest
HEAD with its credential). The kubelet's four policies say which images need it:

- ``NeverVerify``: none (the old, shared behaviour);
- ``NeverVerifyPreloadedImages`` (default): images the agent did not pull (put
  there by the node's maker) run for anyone; pulled ones are verified;
- ``NeverVerifyAllowlistedImages``: preloaded images on the allowlist run for
  anyone; every other image is verified;
- ``AlwaysVerify``: every image, preloaded too.

A credential identity is a SHA-256 of registry, user and password; anonymous
access and the node-wide credential are one shared identity (both are what any
sandbox of the node gets without asking). The records are bounded; a lost record
can cost a verification, never skip one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class VerifyPolicy(StrEnum):
    NEVER_VERIFY = "NeverVerify"
    NEVER_VERIFY_PRELOADED = "NeverVerifyPreloadedImages"
    NEVER_VERIFY_ALLOWLISTED = "NeverVerifyAllowlistedImages"
    ALWAYS_VERIFY = "AlwaysVerify"


SHARED_IDENTITY = "shared"
"""Anonymous access and the node-wide credential: what every sandbox of the node has."""

MAX_IMAGES = 4096
MAX_IDENTITIES = 64
RECORD_VERSION = 1


def credential_identity(registry: str, credential: tuple[str, str] | None) -> str:
    """The identity of a sandbox's own credential for ``registry`` (None: the shared one)."""
    if credential is None:
        return SHARED_IDENTITY
    user, password = credential
    digest = hashlib.sha256("\0".join((registry, user, password)).encode()).hexdigest()
    return f"sha256:{digest}"


class InvalidAllowlistEntry(ValueError):
    pass


def check_allowlist(entries: Iterable[str]) -> list[str]:
    """The allowlist as given, each entry a repository (``registry/path``) or a prefix
    ending ``/*`` (the kubelet's ``preloadedImagesVerificationAllowlist`` form)."""
    checked = []
    for entry in entries:
        name = entry.removesuffix("/*")
        if not name or "*" in name or "@" in name or ":" in name.split("/")[-1]:
            raise InvalidAllowlistEntry(
                f"allowlist entry {entry!r}: want registry/repository or registry/prefix/*, "
                "with no tag, digest or other wildcard"
            )
        checked.append(entry)
    return checked


def allowlisted(name: str, allowlist: Sequence[str]) -> bool:
    """Whether the repository ``name`` (registry/path, no tag) is on the allowlist."""
    for entry in allowlist:
        if entry.endswith("/*"):
            if name.startswith(entry[:-1]):
                return True
        elif name == entry:
            return True
    return False


def needs_verification(
    policy: VerifyPolicy,
    *,
    identity: str,
    verified: frozenset[str],
    pulled_by_agent: bool,
    repository: str,
    allowlist: Sequence[str] = (),
) -> bool:
    """Whether a sandbox of credential ``identity`` must verify before running an image
    the node has. ``pulled_by_agent``: the image came by a pull of this agent's (an
    image without that mark is preloaded); ``verified``: the identities seen to work
    for it; ``repository``: the image's registry/path."""
    if policy is VerifyPolicy.NEVER_VERIFY or identity in verified:
        return False
    if policy is VerifyPolicy.NEVER_VERIFY_PRELOADED:
        return pulled_by_agent
    if policy is VerifyPolicy.NEVER_VERIFY_ALLOWLISTED:
        return pulled_by_agent or not allowlisted(repository, allowlist)
    return True


@dataclass
class AccessRecords:
    """Verified (image, identity) pairs, bounded: at most ``max_images`` images (the
    least recently recorded dropped first) and ``max_identities`` per image (the
    oldest dropped). Dropping a pair only makes its next start verify again."""

    max_images: int = MAX_IMAGES
    max_identities: int = MAX_IDENTITIES
    pairs: dict[str, list[str]] = field(default_factory=dict)

    def verified(self, image: str) -> frozenset[str]:
        return frozenset(self.pairs.get(image, ()))

    def record(self, image: str, identity: str) -> bool:
        """Record a pair; False when it was already the newest record (nothing to save)."""
        was_newest = list(self.pairs)[-1:] == [image]
        identities = self.pairs.pop(image, [])
        changed = not was_newest or identities[-1:] != [identity]
        if identity in identities:
            identities.remove(identity)
        identities.append(identity)
        self.pairs[image] = identities[-self.max_identities :]
        while len(self.pairs) > self.max_images:
            del self.pairs[next(iter(self.pairs))]
            changed = True
        return changed

    def forget(self, image: str) -> None:
        self.pairs.pop(image, None)

    def to_json(self) -> dict[str, Any]:
        return {"version": RECORD_VERSION, "images": dict(self.pairs)}

    @classmethod
    def from_json(
        cls,
        doc: Mapping[str, Any],
        *,
        max_images: int = MAX_IMAGES,
        max_identities: int = MAX_IDENTITIES,
    ) -> AccessRecords:
        """The records of a saved document; anything unreadable in it is dropped (it
        can only cost verifications)."""
        records = cls(max_images=max_images, max_identities=max_identities)
        if doc.get("version") != RECORD_VERSION or not isinstance(doc.get("images"), Mapping):
            return records
        for image, identities in doc["images"].items():
            if isinstance(image, str) and isinstance(identities, list):
                for identity in identities:
                    if isinstance(identity, str):
                        records.record(image, identity)
        return records


__all__ = [
    "MAX_IDENTITIES",
    "MAX_IMAGES",
    "SHARED_IDENTITY",
    "AccessRecords",
    "InvalidAllowlistEntry",
    "VerifyPolicy",
    "allowlisted",
    "check_allowlist",
    "credential_identity",
    "needs_verification",
]
