"""policy.pulling.auth: the credential of a registry among dockerconfigjson documents."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from sandlot.policy.pulling.auth import credential_for


def _auth(user: str, password: str) -> dict[str, str]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize(
    ("registry", "documents", "expected"),
    [
        ("reg.io", [{"auths": {"reg.io": _auth("u", "p")}}], ("u", "p")),
        ("reg.io", [{"auths": {"https://reg.io/v2/": _auth("u", "p")}}], ("u", "p")),
        ("docker.io", [{"auths": {"https://index.docker.io/v1/": _auth("h", "p")}}], ("h", "p")),
        ("reg.io:5000", [{"auths": {"reg.io": _auth("u", "p")}}], None),
        ("reg.io", [{"auths": {"reg.io": {"username": "a", "password": "b"}}}], ("a", "b")),
        (
            "reg.io",
            [{"auths": {"other.io": _auth("x", "y")}}, {"auths": {"reg.io": _auth("2", "p")}}],
            ("2", "p"),
        ),
        (
            "reg.io",
            [{"auths": {"reg.io": _auth("1", "p")}}, {"auths": {"reg.io": _auth("2", "p")}}],
            ("1", "p"),
        ),
        ("reg.io", [{"auths": {"reg.io": {"auth": "!!notbase64"}}}], None),
        ("reg.io", [{"nothing": 1}], None),
    ],
    ids=[
        "host",
        "url-key",
        "docker-hub-legacy-key",
        "port-must-match",
        "username-password",
        "later-document",
        "first-document-wins",
        "bad-base64-ignored",
        "no-auths",
    ],
)
def test_credential_for_registry(
    registry: str, documents: list[dict[str, Any]], expected: tuple[str, str] | None
) -> None:
    assert credential_for(registry, documents) == expected
