"""Who is calling and whether they may: TokenReview and SubjectAccessReview.

The agent's only use of them is ``sandlot logs`` / ``sandlot exec`` (see
``policy.streams``); its identity may create both and nothing more for this.
Answers are the reviews' ``status`` as plain dicts; a failed request raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client


def review_token(api: client.ApiClient, token: str, *, timeout: float) -> dict[str, Any]:
    """The TokenReview status of ``token``: ``authenticated``, ``user``, ``error``."""
    body = client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
    review = client.AuthenticationV1Api(api).create_token_review(body, _request_timeout=timeout)
    return dict(api.sanitize_for_serialization(review.status) or {})


def review_access(
    api: client.ApiClient, spec: Mapping[str, Any], *, timeout: float
) -> dict[str, Any]:
    """The SubjectAccessReview status for ``spec`` (``policy.streams.access_review_spec``)."""
    attributes = dict(spec.get("resourceAttributes") or {})
    body = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=spec.get("user"),
            groups=spec.get("groups"),
            extra=spec.get("extra"),
            uid=spec.get("uid"),
            resource_attributes=client.V1ResourceAttributes(**attributes),
        )
    )
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        body, _request_timeout=timeout
    )
    return dict(api.sanitize_for_serialization(review.status) or {})


__all__ = ["review_access", "review_token"]
