"""The agent's image-pull metrics: pulls and credential verifications by outcome, the
pulls' seconds, the bytes fetched."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

PULL_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
OUTCOMES = ("success", "not_found", "unauthorized", "transient")


class PullMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.pulls = Counter(
            "sandlot_agent_image_pulls_total",
            "Image pulls, by outcome (success, not_found, unauthorized, transient).",
            ["outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "sandlot_agent_image_pull_seconds",
            "Duration of image pulls, failed ones included.",
            buckets=PULL_BUCKETS,
            registry=registry,
        )
        self.bytes = Counter(
            "sandlot_agent_image_pull_bytes_total",
            "Bytes of image content fetched from registries (layers already on the "
            "node are not fetched again).",
            registry=registry,
        )
        self.verifications = Counter(
            "sandlot_agent_image_verifications_total",
            "Checks of a sandbox's own credential against the registry (a manifest HEAD) "
            "before it runs an image the node has, by outcome.",
            ["outcome"],
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.pulls.labels(outcome)
            self.verifications.labels(outcome)

    def observe_pull(self, outcome: str, seconds: float, fetched_bytes: int) -> None:
        self.pulls.labels(outcome).inc()
        self.seconds.observe(seconds)
        self.bytes.inc(fetched_bytes)

    def observe_verification(self, outcome: str) -> None:
        self.verifications.labels(outcome).inc()


__all__ = ["PullMetrics"]
