"""The SDK's calls to the API server (``sandlot.client``): Sandboxes and
SandboxClaims made, read, deleted and watched with the caller's own identity.

Every refusal comes out as ``ApiRefused`` (the HTTP status and the server's
message), so the SDK above maps it to its own errors without importing
``kubernetes``. A wait is one watch from the resourceVersion of a first read,
bounded by the caller's deadline: no polling, and a change between the read and
the watch is never missed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.streamclient import Stream, open_stream
from sandlot.api.common import GROUP, VERSION

# The longest one watch request runs before it is renewed (the deadline may be longer).
WATCH_SLICE = 60


class ApiRefused(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


def _refused(e: ApiException) -> ApiRefused:
    try:
        message = str(json.loads(e.body or "{}").get("message") or e.reason)
    except (ValueError, AttributeError):
        message = str(e.reason)
    return ApiRefused(int(e.status or 0), message)


class SandboxApi:
    """One kubeconfig's (or the pod's) connection to the API server."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        self.api = load_api_client(kubeconfig, user_agent="sandlot-client")
        self.objects = client.CustomObjectsApi(self.api)

    def close(self) -> None:
        self.api.close()

    def get(self, plural: str, namespace: str, name: str) -> dict[str, Any]:
        try:
            got: Any = self.objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as e:
            raise _refused(e) from None
        return dict(got)

    def create(self, plural: str, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        try:
            made: Any = self.objects.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, dict(body)
            )
        except ApiException as e:
            raise _refused(e) from None
        return dict(made)

    def patch(
        self, plural: str, namespace: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """A JSON merge patch of the object; what the API server answers."""
        try:
            patched: Any = self.objects.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, dict(body)
            )
        except ApiException as e:
            raise _refused(e) from None
        return dict(patched)

    def delete(self, plural: str, namespace: str, name: str) -> None:
        """Delete the object; one already gone is no error."""
        try:
            self.objects.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, propagation_policy="Background"
            )
        except ApiException as e:
            if e.status != 404:
                raise _refused(e) from None

    def wait(
        self,
        plural: str,
        namespace: str,
        name: str,
        done: Callable[[dict[str, Any] | None], bool],
        deadline: float,
    ) -> dict[str, Any] | None:
        """The object once ``done(object)`` holds (``done(None)``: it is gone), read
        then watched until ``deadline`` (``time.monotonic()``); ``TimeoutError`` then."""
        selector = f"metadata.name={name}"
        while True:
            try:
                listed: Any = self.objects.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, plural, field_selector=selector
                )
            except ApiException as e:
                raise _refused(e) from None
            items = listed.get("items") or []
            current = dict(items[0]) if items else None
            if done(current):
                return current
            version = (listed.get("metadata") or {}).get("resourceVersion")
            found, seen = self._watch(plural, namespace, selector, version, done, deadline)
            if found:
                return seen
            # The watch expired (410) or ended early: read again, watch again.

    def _watch(
        self,
        plural: str,
        namespace: str,
        selector: str,
        version: str | None,
        done: Callable[[dict[str, Any] | None], bool],
        deadline: float,
    ) -> tuple[bool, dict[str, Any] | None]:
        """(True, the object) once ``done``; (False, None) when the watch must restart."""
        while (left := deadline - time.monotonic()) > 0:
            seconds = max(1, min(WATCH_SLICE, int(left)))
            stream = watch.Watch()
            try:
                for event in stream.stream(
                    self.objects.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    plural,
                    field_selector=selector,
                    resource_version=version,
                    timeout_seconds=seconds,
                    _request_timeout=(5.0, seconds + 5.0),
                ):
                    body = event["object"]
                    if event["type"] == "ERROR":
                        return False, None  # most often 410 Gone: the version is too old
                    version = body["metadata"]["resourceVersion"]
                    seen = None if event["type"] == "DELETED" else dict(body)
                    if done(seen):
                        return True, seen
                    if time.monotonic() >= deadline:
                        break
            except ApiException as e:
                if e.status == 410:
                    return False, None
                raise _refused(e) from None
            finally:
                stream.stop()
        raise TimeoutError("the deadline passed")

    def open_stream(self, path: str) -> Stream:
        return open_stream(self.api, path)


__all__ = ["ApiRefused", "SandboxApi"]
