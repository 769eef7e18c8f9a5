"""Who may open a sandbox stream: the user the API server's front proxy names, and
the SubjectAccessReview the gateway makes for that user. Pure.

An aggregated API server believes the user named in request headers only from a
connection whose client certificate the front-proxy CA signed (and whose name is
allowed); anyone else could write those headers. Then it authorizes that user
itself (delegated authorization), with ``StreamRequest.verb``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from sandlot.policy.streams import (
    EXEC,
    FILES,
    KINDS,
    LOG,
    PORTFORWARD,
    SUBRESOURCE_GROUP,
    SUBRESOURCE_VERSION,
    StreamRequest,
)


@dataclass(frozen=True)
class RequestHeaderConfig:
    """How the API server names the user to an aggregated API server: what
    ``kube-system/extension-apiserver-authentication`` publishes."""

    username_headers: tuple[str, ...] = ("X-Remote-User",)
    uid_headers: tuple[str, ...] = ()
    group_headers: tuple[str, ...] = ("X-Remote-Group",)
    extra_prefixes: tuple[str, ...] = ("X-Remote-Extra-",)
    allowed_names: tuple[str, ...] = ()  # front-proxy certificate CNs; empty: any


@dataclass(frozen=True)
class Caller:
    user: str
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    uid: str = ""


def requestheader_config(data: Mapping[str, str]) -> RequestHeaderConfig:
    """The config in ``extension-apiserver-authentication``'s ``data`` (JSON lists)."""

    def names(key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        raw = data.get(key)
        if raw is None:
            return default
        value = json.loads(raw)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{key}: expected a JSON list of strings, got {raw[:80]!r}")
        return tuple(value)

    base = RequestHeaderConfig()
    return RequestHeaderConfig(
        username_headers=names("requestheader-username-headers", base.username_headers),
        uid_headers=names("requestheader-uid-headers", base.uid_headers),
        group_headers=names("requestheader-group-headers", base.group_headers),
        extra_prefixes=names("requestheader-extra-headers-prefix", base.extra_prefixes),
        allowed_names=names("requestheader-allowed-names", base.allowed_names),
    )


def caller_of(
    headers: Iterable[tuple[str, str]], config: RequestHeaderConfig, proxy_name: str
) -> Caller | None:
    """The user the API server named in ``headers``, from a connection whose
    verified client certificate says ``proxy_name``; None when the connection is not
    the API server's front proxy or names no user. Headers are only believed from
    that certificate: anyone else could write them."""
    if config.allowed_names and proxy_name not in config.allowed_names:
        return None
    pairs = [(k.lower(), v) for k, v in headers]

    def values(names: tuple[str, ...]) -> list[str]:
        wanted = {n.lower() for n in names}
        return [v for k, v in pairs if k in wanted]

    users = values(config.username_headers)
    if not users or not users[0]:
        return None
    extra: dict[str, list[str]] = {}
    for k, v in pairs:
        for prefix in config.extra_prefixes:
            if k.startswith(prefix.lower()) and len(k) > len(prefix):
                extra.setdefault(unquote(k[len(prefix) :]), []).append(v)
    uids = values(config.uid_headers)
    return Caller(
        user=users[0],
        groups=tuple(values(config.group_headers)),
        extra={k: tuple(v) for k, v in extra.items()},
        uid=uids[0] if uids else "",
    )


def resource_attributes(request: StreamRequest) -> dict[str, str]:
    """The SubjectAccessReview's ``resourceAttributes`` for ``request``."""
    return {
        "namespace": request.namespace,
        "group": SUBRESOURCE_GROUP,
        "resource": "sandboxes",
        "subresource": request.kind,
        "name": request.name,
        "verb": request.verb,
    }


def access_review_spec(caller: Caller, request: StreamRequest) -> dict[str, Any]:
    """The SubjectAccessReview spec asking for ``caller`` exactly as the API server
    named it: user, groups, extra and uid."""
    spec: dict[str, Any] = {
        "user": caller.user,
        "groups": list(caller.groups),
        "resourceAttributes": resource_attributes(request),
    }
    if caller.extra:
        spec["extra"] = {k: list(v) for k, v in caller.extra.items()}
    if caller.uid:
        spec["uid"] = caller.uid
    return spec


@dataclass(frozen=True)
class Access:
    allowed: bool
    code: int  # the HTTP status to answer with when not allowed
    message: str
    user: str = ""


def what_is_asked(request: StreamRequest) -> str:
    return (
        f'{request.verb} sandboxes/{request.kind} "{request.name}" in namespace '
        f'"{request.namespace}"'
    )


def decide_access(
    caller: Caller | None, access_review: Mapping[str, Any] | None, request: StreamRequest
) -> Access:
    """From the caller the front proxy named and the SubjectAccessReview's ``status``
    (None: not asked), whether the caller may; ``allowed`` only when both say yes."""
    if caller is None:
        return Access(
            False,
            401,
            "no user named by the API server's front proxy: streams are served only "
            "through the API server",
        )
    if access_review is None:
        return Access(False, 403, "access was not reviewed", caller.user)
    asked = what_is_asked(request)
    if access_review.get("denied") or not access_review.get("allowed"):
        why = access_review.get("reason") or access_review.get("evaluationError") or ""
        return Access(
            False,
            403,
            f'user "{caller.user}" cannot {asked}' + (f": {why}" if why else ""),
            caller.user,
        )
    return Access(True, 200, f'user "{caller.user}" may {asked}', caller.user)


# -- discovery: what the API server asks an aggregated API for ---------------------------


RESOURCE_VERBS = {
    LOG: ("get",),
    EXEC: ("create",),
    FILES: ("create", "delete"),
    PORTFORWARD: ("create",),
}


def api_group() -> dict[str, Any]:
    version = {
        "groupVersion": f"{SUBRESOURCE_GROUP}/{SUBRESOURCE_VERSION}",
        "version": SUBRESOURCE_VERSION,
    }
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": SUBRESOURCE_GROUP,
        "versions": [version],
        "preferredVersion": version,
    }


def api_group_list() -> dict[str, Any]:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]}


def api_resource_list() -> dict[str, Any]:
    def resource(kind: str) -> dict[str, Any]:
        return {
            "name": f"sandboxes/{kind}",
            "singularName": "",
            "namespaced": True,
            "kind": "SandboxStream",
            "verbs": sorted({"get", *RESOURCE_VERBS[kind]}),
        }

    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{SUBRESOURCE_GROUP}/{SUBRESOURCE_VERSION}",
        "resources": [resource(kind) for kind in KINDS],
    }


__all__ = [
    "Access",
    "Caller",
    "RequestHeaderConfig",
    "access_review_spec",
    "api_group",
    "api_group_list",
    "api_resource_list",
    "caller_of",
    "decide_access",
    "requestheader_config",
    "resource_attributes",
    "what_is_asked",
]
