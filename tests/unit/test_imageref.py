"""policy.pulling.reference: references read as docker and containerd read them."""

from __future__ import annotations

import pytest

from sandlot.policy.pulling.reference import InvalidReference, parse_reference


@pytest.mark.parametrize(
    ("image", "registry", "repository", "reference", "api_host", "loopback"),
    [
        ("busybox", "docker.io", "library/busybox", "latest", "registry-1.docker.io", False),
        ("python:3.12", "docker.io", "library/python", "3.12", "registry-1.docker.io", False),
        (
            "docker.io/library/python:3.12",
            "docker.io",
            "library/python",
            "3.12",
            "registry-1.docker.io",
            False,
        ),
        ("user/app", "docker.io", "user/app", "latest", "registry-1.docker.io", False),
        ("ghcr.io/org/app:v1", "ghcr.io", "org/app", "v1", "ghcr.io", False),
        ("localhost/app", "localhost", "app", "latest", "localhost", True),
        ("127.0.0.1:5000/a/b:t", "127.0.0.1:5000", "a/b", "t", "127.0.0.1:5000", True),
        (
            "localhost:5000/a@sha256:" + "a" * 64,
            "localhost:5000",
            "a",
            "sha256:" + "a" * 64,
            "localhost:5000",
            True,
        ),
        (
            "reg.example:443/a:t@sha256:" + "b" * 64,
            "reg.example:443",
            "a",
            "sha256:" + "b" * 64,
            "reg.example:443",
            False,
        ),
    ],
    ids=[
        "bare-name",
        "name-tag",
        "full-hub",
        "hub-user",
        "other-registry",
        "localhost",
        "loopback-port",
        "digest",
        "tag-and-digest",
    ],
)
def test_reference_is_normalised(
    image: str, registry: str, repository: str, reference: str, api_host: str, loopback: bool
) -> None:
    ref = parse_reference(image)
    assert (ref.registry, ref.repository, ref.reference, ref.api_host, ref.loopback) == (
        registry,
        repository,
        reference,
        api_host,
        loopback,
    )


@pytest.mark.parametrize(
    "image",
    ["", " busybox", "Upper/Case", "app@sha256:short", "app:bad tag", "reg.io/"],
    ids=["empty", "space", "upper-case", "short-digest", "bad-tag", "no-path"],
)
def test_invalid_reference_is_refused_with_its_reason(image: str) -> None:
    with pytest.raises(InvalidReference, match="not"):
        parse_reference(image)
