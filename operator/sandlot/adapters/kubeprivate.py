"""The one door to the Kubernetes client's internals.

sandlot uses four things of ``kubernetes`` that are not its documented API, each
for a reason given where it is used:

- ``ApiClient.rest_client.request``: every request of an ``ApiClient`` passes
  through it, so ``kube.load_api_client`` wraps it once (a bound on every call,
  the leader's write fence, the request counter);
- the same function sends ``MergePatcher``'s merge patches and reads, skipping
  the generated client's per-call validation on the hot paths;
- ``kubernetes.watch.watch.iter_resp_lines`` reads a watch's lines from a raw
  response, so informers never build the generated models;
- ``ApiClient.sanitize_for_serialization`` turns a generated model into JSON.

Nothing else in the package touches them (``tests/unit/test_kubeprivate.py``
checks both that and that each still has the shape used here, so an upgrade of
the client that moves one fails there, by name, and not in production).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client
from kubernetes.watch.watch import iter_resp_lines

Request = Callable[..., Any]  # (method, url, *, headers, body, _request_timeout, ...)


def request_of(api: client.ApiClient) -> Request:
    """The function every request of ``api`` goes through."""
    request: Request = api.rest_client.request
    return request


def install_request(api: client.ApiClient, request: Request) -> None:
    """Send every request of ``api`` through ``request`` from now on."""
    api.rest_client.request = request  # type: ignore[method-assign]


def send(
    api: client.ApiClient,
    method: str,
    url: str,
    headers: Mapping[str, str],
    body: Any,
    timeout: float | None = None,
) -> Any:
    """One request on ``api``'s pooled connections (and through whatever wraps them);
    a JSON ``body`` is serialized once by the REST client; ``timeout`` seconds (None:
    the client's bound). The raw response."""
    bound = {"_request_timeout": timeout} if timeout is not None else {}
    return request_of(api)(method, url, headers=dict(headers), body=body, **bound)


def watch_lines(response: Any) -> Iterator[str]:
    """A watch response's lines as they arrive."""
    lines: Iterator[str] = iter_resp_lines(response)
    return lines


def to_json(api: client.ApiClient, model: Any) -> Any:
    """A generated model as the API server's JSON (dicts, lists, strings)."""
    return api.sanitize_for_serialization(model)


__all__ = ["Request", "install_request", "request_of", "send", "to_json", "watch_lines"]
