"""A merge-patch straight onto the ApiClient's pooled connections.

The generated client spends, per request, more of the CPU that the API server
shares on a small machine than the write itself: argument validation
(pydantic's ``validate_call``), parameter serialization, and a refresh of the
kubeconfig's credentials on every call. Status writes are the operator's hot
path when a node is lost (thousands of them back to back), so they go through
here instead: the same request function (``kubeprivate.send``, hence the same pooled
connections, the write fence before every write, the bounded request timeout
and the request counter ``kube.load_api_client`` installed), the body serialized
once by ``json.dumps``, and the credentials read at most once per
``AUTH_REFRESH`` seconds.

What the API server answers is unchanged: a non-2xx answer raises the same
``ApiException`` subclass the generated client raises (409 a ``ConflictException``
with ``.status`` 409), so every caller keeps its rules. ``read`` is a GET on the
same path, for a read a hot path makes every time (a start's Namespace): JSON in,
a dict out, no generated model built on the way.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kubeprivate import send

AUTH_REFRESH = 30.0  # seconds a read of the credentials is reused (tokens rotate in hours)


class MergePatcher:
    def __init__(self, api: client.ApiClient, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.clock = clock
        self._lock = threading.Lock()
        self._auth: dict[str, str] = {}
        self._auth_read: float | None = None

    def _headers(self, content_type: str = "application/merge-patch+json") -> dict[str, str]:
        now = self.clock()
        with self._lock:
            if self._auth_read is None or now - self._auth_read >= AUTH_REFRESH:
                settings = self.api.configuration.auth_settings()  # runs the refresh hook
                self._auth = {
                    s["key"]: s["value"]
                    for s in settings.values()
                    if s.get("in") == "header" and s.get("value")
                }
                self._auth_read = now
            auth = self._auth
        return {
            **self.api.default_headers,
            **auth,
            "Accept": "application/json",
            "Content-Type": content_type,
        }

    def patch(self, *segments: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch ``body`` onto ``/segments...`` (each segment quoted); the object."""
        # The REST client serializes a JSON body itself (once, with json.dumps).
        return self._answer(send(self.api, "PATCH", self._url(segments), self._headers(), body))

    def read(self, *segments: str, timeout: float | None = None) -> dict[str, Any]:
        """GET ``/segments...`` (each segment quoted) within ``timeout`` seconds (None:
        the client's bound); the object."""
        headers = self._headers("application/json")
        return self._answer(send(self.api, "GET", self._url(segments), headers, None, timeout))

    def _url(self, segments: tuple[str, ...]) -> str:
        host: str = self.api.configuration.host
        return host + "/" + "/".join(quote(s, safe="") for s in segments)

    @staticmethod
    def _answer(resp: Any) -> dict[str, Any]:
        data = resp.read()
        text = data.decode("utf-8") if isinstance(data, bytes) else str(data)
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=text, data=None)
        out: dict[str, Any] = json.loads(text)
        return out
