"""Image references, read as containerd and Docker read them: a pure parser.

``busybox`` is ``docker.io/library/busybox:latest``; the first path component is
a registry host when it has a dot or a port or is ``localhost``; ``@sha256:...``
pins a digest. ``docker.io`` is served by ``registry-1.docker.io``. A loopback
registry (``localhost``, ``127.0.0.1``, ``::1``) speaks plain HTTP without any
setting, as containerd's default hosts and Docker allow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DOCKER_HUB = "docker.io"
DOCKER_HUB_API = "registry-1.docker.io"
_TAG = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$")
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class InvalidReference(ValueError):
    """The string is not an image reference."""


@dataclass(frozen=True)
class ImageReference:
    registry: str
    """The registry as named (``docker.io``, ``127.0.0.1:5000``)."""
    repository: str
    """The repository path (``library/busybox``)."""
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What the manifest is fetched by: the digest if pinned, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def name(self) -> str:
        """The full name, as the image record in containerd is called."""
        name = f"{self.registry}/{self.repository}"
        if self.tag:
            name += f":{self.tag}"
        if self.digest:
            name += f"@{self.digest}"
        return name

    @property
    def api_host(self) -> str:
        """The host that serves the registry's v2 API."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    @property
    def loopback(self) -> bool:
        host = (
            self.registry.rsplit(":", 1)[0]
            if not self.registry.startswith("[")
            else (self.registry.split("]", 1)[0] + "]")
        )
        return host in LOOPBACK_HOSTS


def _is_host(component: str) -> bool:
    return "." in component or ":" in component or component == "localhost"


def parse_reference(image: str) -> ImageReference:
    """``image`` as a reference, normalised as ``docker pull`` would; raises
    ``InvalidReference`` naming what is wrong."""
    if not image or image != image.strip():
        raise InvalidReference(f"{image!r} is not an image reference")
    rest, digest = image, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise InvalidReference(f"{image!r}: {digest!r} is not a digest")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            raise InvalidReference(f"{image!r}: {tag!r} is not a tag")
    first, _, remainder = rest.partition("/")
    if remainder and _is_host(first):
        registry, path = first, remainder
    else:
        registry, path = DOCKER_HUB, rest
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if not path or not all(_COMPONENT.match(part) for part in path.split("/")):
        raise InvalidReference(f"{image!r}: {path!r} is not a repository path")
    if tag is None and digest is None:
        tag = "latest"
    return ImageReference(registry=registry, repository=path, tag=tag, digest=digest)


__all__ = [
    "DOCKER_HUB",
    "ImageReference",
    "InvalidReference",
    "parse_reference",
]
