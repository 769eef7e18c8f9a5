"""The stream gateway's metrics (prometheus-client; one registry per gateway)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.streams = Counter(
            "sandlot_gateway_streams",
            "Stream requests by subresource and outcome (opened, refused_<status>, bad_request; "
            "idle: an opened one later closed by the idle timeout).",
            ["subresource", "outcome"],
            registry=registry,
        )
        self.open = Gauge("sandlot_gateway_streams_open", "Streams open now.", registry=registry)
        self.reviews = Counter(
            "sandlot_gateway_access_reviews",
            "Access-review answers by source: api (a SubjectAccessReview asked) or cache "
            "(a fresh allow of the same question, kept review_cache_ttl).",
            ["source"],
            registry=registry,
        )


__all__ = ["GatewayMetrics"]
