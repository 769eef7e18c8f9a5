"""A client of a registry's v2 API (the OCI distribution spec), bounded in every read.

Only what a pull needs: the manifest of a reference and the blobs it names,
streamed. Authentication follows the spec's challenge: an anonymous request
first; on a 401 whose ``WWW-Authenticate`` says ``Basic``, the credential is sent
as such; on ``Bearer``, a token is asked from the named realm for the scope the
challenge names (else ``repository:<name>:pull``, ``pull,push`` for an upload,
``delete`` for a delete) with the credential, if any, and sent with the retry.
The token is kept for the rest of the client's requests while they need no more.

Errors say the HTTP status, its reason and the spec's error codes
(``HTTP 404 Not Found (MANIFEST_UNKNOWN)``), never the registry's own text (it
reaches a tenant's status), sorted into what the pull policy needs to know: not
found, unauthorized, or something that may pass. Where requests may go (private
addresses, redirects, token realms) is ``policy.pulling.access``'s decision,
applied here on every connection after DNS and on every redirect hop.

A stall is a read that gets no byte for ``stall_timeout`` seconds (the socket's
read timeout), so a registry that stops sending mid-blob fails that read within
the bound instead of holding the pull until its overall deadline.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import HTTPError, NewConnectionError, ReadTimeoutError

from sandlot.adapters.deadline import Deadline
from sandlot.adapters.runtime import RuntimeTimeout
from sandlot.policy.imagecaps import MAX_MANIFEST_BYTES, mib
from sandlot.policy.pulling import (
    FailureKind,
    RegistryAccess,
    address_refusal,
    realm_refusal,
    redirect_refusal,
    same_host,
    status_message,
)

log = logging.getLogger(__name__)

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
CHUNK = 1024 * 1024
ERROR_BODY_BYTES = 64 * 1024
"""What is read of a refusal's body (or a token answer): the registry's words fit."""
_PARAM = re.compile(r'(\w+)="([^"]*)"')
Body = bytes | Iterable[bytes]
"""A request's body: whole, or streamed in chunks (with its ``Content-Length`` given)."""


class RegistryError(Exception):
    """A registry request failed; ``kind`` says whether retrying may help."""

    def __init__(
        self, message: str, kind: FailureKind = FailureKind.TRANSIENT, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        """The registry's HTTP status, when it answered with one."""


@dataclass(frozen=True)
class Credential:
    username: str
    password: str


@dataclass(frozen=True)
class Endpoint:
    """Where a registry's API is reached: ``url`` is ``scheme://host[:port]``."""

    url: str
    ca_file: str | None = None
    skip_verify: bool = False
    override_path: bool = False
    """``url`` already includes the API's path prefix (hosts.toml ``override_path``)."""

    def api(self, path: str) -> str:
        return f"{self.url.rstrip('/')}{path if self.override_path else '/v2' + path}"


def _kind(status: int) -> FailureKind:
    if status == 404:
        return FailureKind.NOT_FOUND
    if status in (401, 403):
        return FailureKind.UNAUTHORIZED
    return FailureKind.TRANSIENT


def _actions(method: str) -> str:
    """The actions a request needs on its repository, for a challenge that names no
    scope: as the distribution registry asks them (a delete needs ``delete``)."""
    if method in ("GET", "HEAD"):
        return "pull"
    return "delete" if method == "DELETE" else "pull,push"


def _drop(response: urllib3.BaseHTTPResponse) -> bytes:
    """The start of a response's body (at most ``ERROR_BODY_BYTES``), its connection
    given back for reuse only when nothing of the body is left unread."""
    body = response.read(ERROR_BODY_BYTES)
    if response.read(1):  # more than a registry's error says: not worth reading
        response.close()
    response.release_conn()
    return bytes(body)


def _guarded(base: type[HTTPConnection], access: RegistryAccess) -> type[HTTPConnection]:
    """``base`` connecting only to addresses ``access`` allows for its host: the name is
    resolved here and the socket connects to the very address that was checked."""

    def _new_conn(self: Any) -> socket.socket:
        try:
            found = socket.getaddrinfo(self._dns_host, self.port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise NewConnectionError(self, f"cannot resolve {self.host}: {exc}") from exc
        refusal = ""
        for family, kind, proto, _, address in found:
            why = address_refusal(self.host, self.port, str(address[0]), access)
            if why is not None:
                refusal = why
                continue
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(self.timeout if isinstance(self.timeout, float | int) else None)
                sock.connect(address)
            except OSError as exc:
                sock.close()
                refusal = refusal or str(exc)
                continue
            for option in self.socket_options or ():
                sock.setsockopt(*option)
            return sock
        raise NewConnectionError(self, refusal or f"no address for {self.host}")

    return type(f"Guarded{base.__name__}", (base,), {"_new_conn": _new_conn})


def _pool_manager(access: RegistryAccess, **kwargs: Any) -> urllib3.PoolManager:
    manager = urllib3.PoolManager(num_pools=4, maxsize=4, **kwargs)
    http_pool = type(
        "GuardedHTTPPool",
        (HTTPConnectionPool,),
        {"ConnectionCls": _guarded(HTTPConnection, access)},
    )
    https_pool = type(
        "GuardedHTTPSPool",
        (HTTPSConnectionPool,),
        {"ConnectionCls": _guarded(HTTPSConnection, access)},
    )
    manager.pool_classes_by_scheme = {"http": http_pool, "https": https_pool}
    return manager


class RegistryClient:
    """Requests to one repository on one endpoint, for the length of one pull."""

    def __init__(
        self,
        endpoint: Endpoint,
        repository: str,
        credential: Credential | None,
        *,
        connect_timeout: float,
        stall_timeout: float,
        deadline: Deadline,
        access: RegistryAccess | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.stall_timeout = stall_timeout
        self.deadline = deadline
        self.repository = repository
        self.credential = credential
        self.access = access or RegistryAccess()
        kwargs: dict[str, object] = {"retries": False}
        if endpoint.url.startswith("https://"):
            kwargs["cert_reqs"] = "CERT_NONE" if endpoint.skip_verify else "CERT_REQUIRED"
            if endpoint.ca_file:
                kwargs["ca_certs"] = endpoint.ca_file
        self._http = _pool_manager(self.access, **kwargs)
        self._authorization: str | None = None
        self._scope = ""
        """What the bearer token held was asked for (a push asks for more than a pull)."""
        self._cut_by_deadline = False

    def close(self) -> None:
        self._http.clear()

    # ------------------------------------------------------------ requests

    def _request(
        self,
        path: str,
        headers: Mapping[str, str],
        *,
        stream: bool = False,
        method: str = "GET",
        body: Callable[[], Body] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """``path`` under the API (or a whole URL of the registry's, as an upload's
        ``Location``); ``body`` makes the request's body, again for the retry a
        challenge asks for (a streamed body is read once)."""
        url = path if path.startswith(("http://", "https://")) else self.endpoint.api(path)
        response = self._follow(method, url, headers, stream, body)
        if response.status == 401 and self._authorize(response, method):
            _drop(response)
            response = self._follow(method, url, headers, stream, body)
        if response.status >= 400:
            said = _drop(response)
            raise RegistryError(
                f"{method} {url}: {status_message(response.status, said)}",
                _kind(response.status),
                response.status,
            )
        return response

    def _follow(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        stream: bool,
        body: Callable[[], Body] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """The answer to ``url``, redirects followed one hop at a time where
        ``policy.pulling.access`` allows; the credential only to the registry's host."""
        hops = 0
        while True:
            own = same_host(url, self.endpoint.url)
            made = body() if body is not None else None
            response = self._send(method, url, headers, stream, authorize=own, body=made)
            location = response.headers.get("Location")
            if response.status not in (301, 302, 303, 307, 308) or not location:
                return response
            _drop(response)
            target = urljoin(url, location)
            refusal = redirect_refusal(url, target, self.endpoint.url, self.access, hops)
            if refusal is not None:
                log.warning("%s %s: %s (to %s)", method, url, refusal, target[:200])
                raise RegistryError(f"{method} {url}: {refusal}")
            url, hops = target, hops + 1

    def _timeout(self, what: str) -> urllib3.Timeout:
        """Each read waits at most the stall timeout, and never past the pull's deadline."""
        left = self.deadline.remaining(what)
        self._cut_by_deadline = left < self.stall_timeout
        return urllib3.Timeout(
            connect=min(self.connect_timeout, left), read=min(self.stall_timeout, left)
        )

    def _stalled(self, what: str, exc: Exception) -> RegistryError:
        if self._cut_by_deadline:  # the deadline, not a stall, cut the read
            self.deadline.remaining(what)
            raise RuntimeTimeout(f"{what}: deadline of {self.deadline.seconds:g}s passed")
        return RegistryError(f"{what}: no bytes for {self.stall_timeout:g}s (stalled): {exc}")

    def _send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        stream: bool,
        *,
        authorize: bool,
        body: Body | None = None,
    ) -> urllib3.BaseHTTPResponse:
        all_headers = dict(headers)
        if self._authorization and authorize:
            all_headers["Authorization"] = self._authorization
        what = f"{method} {url}"
        try:
            return self._http.request(
                method,
                url,
                body=body,
                headers=all_headers,
                preload_content=not stream,
                decode_content=False,
                redirect=False,
                timeout=self._timeout(what),
            )
        except ReadTimeoutError as exc:
            raise self._stalled(what, exc) from exc
        except HTTPError as exc:
            raise RegistryError(f"{what}: {exc}") from exc

    def _authorize(self, response: urllib3.BaseHTTPResponse, method: str) -> bool:
        """Answer a 401's challenge to ``method``; False when there is nothing more
        to try."""
        challenge = response.headers.get("WWW-Authenticate", "")
        scheme, _, params_text = challenge.partition(" ")
        params = dict(_PARAM.findall(params_text))
        if scheme.lower() == "basic":
            if self.credential is None or self._authorization is not None:
                return False
            pair = f"{self.credential.username}:{self.credential.password}".encode()
            self._authorization = "Basic " + base64.b64encode(pair).decode()
            return True
        if scheme.lower() == "bearer" and "realm" in params:
            scope = params.get("scope") or f"repository:{self.repository}:{_actions(method)}"
            bearer = self._authorization is not None and self._authorization.startswith("Bearer")
            if bearer and scope == self._scope:
                return False  # a token was refused: another one for that scope would be too
            self._authorization, self._scope = "Bearer " + self._token(params, scope), scope
            return True
        return False

    def _token(self, params: Mapping[str, str], scope: str) -> str:
        fields = {"scope": scope}
        if params.get("service"):
            fields["service"] = params["service"]
        headers = {}
        if self.credential is not None:
            pair = f"{self.credential.username}:{self.credential.password}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        # The realm is the registry's text: messages say "the realm", the log says which.
        realm = params["realm"]
        refusal = realm_refusal(realm, self.endpoint.url)
        if refusal is not None:
            log.warning("token realm %s refused: %s", realm[:200], refusal)
            raise RegistryError(f"token for {self.repository}: {refusal}")
        try:
            response = self._http.request(
                "GET",
                realm,
                fields=fields,
                headers=headers,
                timeout=self._timeout(realm),
                preload_content=False,
                redirect=False,
            )
            data = _drop(response)
        except HTTPError as exc:
            log.warning("token realm %s: %s", realm[:200], exc)
            private = "registry_private_hosts" in str(exc)
            why = (
                "the token realm is at a private address, used only if its host is listed "
                "in registry_private_hosts"
                if private
                else "the token realm could not be reached"
            )
            raise RegistryError(f"token for {self.repository}: {why}") from exc
        if response.status >= 400:
            raise RegistryError(
                f"token for {self.repository}: {status_message(response.status, data)}",
                _kind(response.status),
            )
        try:
            answer = json.loads(data)
            return str(answer.get("token") or answer["access_token"])
        except (ValueError, KeyError, TypeError) as exc:
            raise RegistryError(f"token for {self.repository}: no token in the answer") from exc

    # ------------------------------------------------------------ the API

    def request(
        self,
        path: str,
        headers: Mapping[str, str],
        *,
        method: str = "GET",
        body: Callable[[], Body] | None = None,
    ) -> tuple[int, Mapping[str, str]]:
        """One request under this client's bounds and auth (``push`` builds on
        it); its status and headers, the body dropped; ``RegistryError`` past 399."""
        response = self._request(path, headers, method=method, body=body, stream=True)
        _drop(response)
        return response.status, response.headers

    def manifest(self, reference: str) -> tuple[bytes, str]:
        """The manifest or index named by a tag or digest, and its media type; past
        ``MAX_MANIFEST_BYTES`` refused (``RegistryError`` of kind ``TOO_LARGE``)
        before more than that is held."""
        path = f"/{self.repository}/manifests/{reference}"
        response = self._request(path, {"Accept": ", ".join(MANIFEST_TYPES)}, stream=True)
        media_type = (response.headers.get("Content-Type") or "").split(";", 1)[0].strip()
        what = f"manifest {reference}"
        return b"".join(self._chunks(response, path, what, MAX_MANIFEST_BYTES)), media_type

    def manifest_exists(self, reference: str) -> None:
        """Return when the registry serves the manifest to this client's credential (a
        HEAD, nothing of the manifest fetched); else raise ``RegistryError``."""
        path = f"/{self.repository}/manifests/{reference}"
        _drop(self._request(path, {"Accept": ", ".join(MANIFEST_TYPES)}, method="HEAD"))

    def delete_manifest(self, digest: str) -> bool:
        """Delete the manifest ``digest``, and with it the tags naming it: True when it
        is gone (deleted now, or before); False when this registry does not delete
        (405 or the spec's ``UNSUPPORTED``: deletes disabled, as the distribution
        registry has them by default). A bearer token is asked for the ``delete``
        action when the registry's challenge names no scope."""
        try:
            self.request(f"/{self.repository}/manifests/{digest}", {}, method="DELETE")
        except RegistryError as exc:
            if exc.status == 404:
                return True
            if exc.status == 405 or "UNSUPPORTED" in str(exc):
                return False
            raise
        return True

    def blob(self, digest: str, *, limit: int | None = None) -> Iterator[bytes]:
        """The blob's bytes in chunks as they arrive; a stall raises ``RegistryError``,
        and so does a blob past ``limit`` bytes (kind ``TOO_LARGE``)."""
        path = f"/{self.repository}/blobs/{digest}"
        response = self._request(path, {}, stream=True)
        return self._chunks(response, path, f"blob {digest}", limit)

    def _chunks(
        self, response: urllib3.BaseHTTPResponse, path: str, what: str, limit: int | None
    ) -> Iterator[bytes]:
        url = self.endpoint.api(path)
        got = 0
        try:
            while True:
                try:
                    chunk = response.read(CHUNK if limit is None else min(CHUNK, limit + 1 - got))
                except ReadTimeoutError as exc:
                    raise self._stalled(f"GET {url} (mid-blob)", exc) from exc
                except HTTPError as exc:
                    raise RegistryError(f"GET {url}: {exc}") from exc
                if not chunk:
                    return
                got += len(chunk)
                if limit is not None and got > limit:
                    raise RegistryError(
                        f"GET {url}: {what} is more than {mib(limit)}, the cap",
                        FailureKind.TOO_LARGE,
                    )
                yield chunk
        finally:
            response.release_conn()


__all__ = ["Credential", "Endpoint", "RegistryClient", "RegistryError"]
