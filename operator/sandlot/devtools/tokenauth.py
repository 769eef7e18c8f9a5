"""A registry token server on loopback, for a registry behind bearer-token auth.

The distribution spec's token flow: the registry answers 401 with
``WWW-Authenticate: Bearer realm=...,service=...,scope=...``; the client asks the
realm for a token (basic auth with its credential, if any) and retries with it.
``docker-registry`` verifies the token itself: an RS256 JWT whose ``x5c`` header
carries a certificate in the registry's ``rootcertbundle``. This server signs
such tokens with ``openssl`` (a key and self-signed certificate made at start),
granting the scope's actions to a known user and ``pull`` to anyone when
``anonymous_pull`` is set.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

SERVICE = "sandlot-test-registry"
ISSUER = "sandlot-test-issuer"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    def __init__(self, root: Path, users: dict[str, str], *, anonymous_pull: bool = False) -> None:
        self.root = root
        self.users = dict(users)
        self.anonymous_pull = anonymous_pull
        self.issued = 0
        self.scopes: list[str] = []
        """The scope of every token asked for, in order."""
        root.mkdir(parents=True, exist_ok=True)
        self.key = root / "token.key"
        self.cert = root / "token.crt"
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
                *("-subj", "/CN=sandlot-test-token", "-keyout", str(self.key)),
                *("-out", str(self.cert)),
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        der = subprocess.run(
            ["openssl", "x509", "-in", str(self.cert), "-outform", "DER"],
            check=True,
            capture_output=True,
            timeout=30,
        ).stdout
        self._x5c = base64.b64encode(der).decode()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def _sign(self, claims: dict[str, object]) -> str:
        header = {"alg": "RS256", "typ": "JWT", "x5c": [self._x5c]}
        signing_input = (
            f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        )
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key)],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
            timeout=30,
        ).stdout
        return f"{signing_input}.{_b64url(signature)}"

    def _user(self, authorization: str | None) -> str | None:
        """The user a Basic header proves, '' for none, None for a wrong one."""
        if not authorization:
            return ""
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        user, _, password = base64.b64decode(value).decode().partition(":")
        return user if self.users.get(user) == password else None

    def token(self, authorization: str | None, scope: str) -> str | None:
        self.scopes.append(scope)
        user = self._user(authorization)
        if user is None:
            return None
        access = []
        if scope.count(":") >= 2:
            kind, name, actions = scope.split(":", 2)
            granted = actions.split(",") if user else (["pull"] if self.anonymous_pull else [])
            access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        self.issued += 1
        return self._sign(
            {
                "iss": ISSUER,
                "sub": user,
                "aud": SERVICE,
                "exp": now + 300,
                "nbf": now - 10,
                "iat": now,
                "jti": uuid.uuid4().hex,
                "access": access,
            }
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                token = server.token(
                    self.headers.get("Authorization"), (query.get("scope") or [""])[0]
                )
                if token is None:
                    body, status = b'{"details":"wrong credential"}', 401
                else:
                    body, status = json.dumps({"token": token, "access_token": token}).encode(), 200
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: object) -> None:
                pass

        return Handler

    def registry_config(self) -> list[str]:
        """The ``auth:`` section of a registry config that trusts this server."""
        return [
            "auth:",
            "  token:",
            f"    realm: {self.realm}",
            f"    service: {SERVICE}",
            f"    issuer: {ISSUER}",
            f"    rootcertbundle: {self.cert}",
        ]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


__all__ = ["TokenServer"]
