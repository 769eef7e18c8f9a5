"""Whether a user may: SubjectAccessReview, made under the caller's own identity.

The stream gateway's use of it is ``sandlot logs`` / ``sandlot exec`` (see
``policy.streams``): delegated authorization, as every aggregated API server does.
Answers are the review's ``status`` as a plain dict; a failed request raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes import client

from sandlot.adapters.kubeprivate import to_json


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
    return dict(to_json(api, review.status) or {})


__all__ = ["review_access"]
