"""The operator's Prometheus metrics. One instance per registry: tests give each
operator a fresh ``CollectorRegistry``; the program uses the default one."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.nodes = Gauge(
            "sandlot_operator_nodes",
            "SandboxNodes by observed phase (Ready, NotReady, Disabled).",
            ["phase"],
            registry=registry,
        )
        self.grace_expirations = Counter(
            "sandlot_operator_grace_expirations_total",
            "NotReady nodes whose grace period ended (counted once per episode).",
            registry=registry,
        )
        self.marked_dead = Counter(
            "sandlot_operator_sandboxes_marked_dead_total",
            "Sandboxes the operator set to Dead, by reason.",
            ["reason"],
            registry=registry,
        )
        self.mark_failures = Counter(
            "sandlot_operator_mark_failures_total",
            "Sandboxes whose Dead marking failed (the node is retried).",
            registry=registry,
        )
        self.mark_seconds = Histogram(
            "sandlot_operator_mark_duration_seconds",
            "Time to list a node's sandboxes and mark the non-terminal ones Dead.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "sandlot_operator_node_reconcile_duration_seconds",
            "Time to evaluate (and act on) one node.",
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30),
            registry=registry,
        )
        self.hold_active = Gauge(
            "sandlot_operator_mass_failure_hold",
            "1 while the mass-failure guard holds all Dead marking.",
            registry=registry,
        )
        self.guard_held = Gauge(
            "sandlot_operator_guard_held_seconds",
            "How long the mass-failure guard has held back the longest-held node's Dead "
            "marking, in seconds since its grace period ended (0 when none is held).",
            registry=registry,
        )
        self.is_leader = Gauge(
            "sandlot_operator_leader",
            "1 on the replica that currently acts.",
            registry=registry,
        )
        self.api_requests = Counter(
            "sandlot_operator_api_requests_total",
            "Requests the operator's controllers sent to the API server (client side), "
            "by verb and resource.",
            ["verb", "resource"],
            registry=registry,
        )
        self.api_failures = Counter(
            "sandlot_operator_api_failures_total",
            "Requests the API server failed: a 5xx answer (code), or none at all (code "
            "'none': a timeout, a refused or broken connection), by verb and resource.",
            ["verb", "resource", "code"],
            registry=registry,
        )
        self.writes_fenced = Counter(
            "sandlot_operator_writes_fenced_total",
            "Writes the API server's leader fence refused because it saw another holder of "
            "the leader Lease (resent while this replica still leads: right after a "
            "takeover the server's copy of the Lease may trail), by resource.",
            ["resource"],
            registry=registry,
        )


class WorkloadMetrics:
    """The scheduler's, the pool controller's and routing's metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.scheduling_attempts = Counter(
            "sandlot_operator_scheduling_attempts_total",
            "Scheduling decisions and binds, by result (bound, taken, conflict, gone, "
            "unschedulable, error).",
            ["result"],
            registry=registry,
        )
        self.unschedulable = Gauge(
            "sandlot_operator_unschedulable_sandboxes",
            "Pending sandboxes no node fits, waiting for room.",
            registry=registry,
        )
        self.pool_members_created = Counter(
            "sandlot_operator_pool_members_created_total",
            "Sandboxes created by pools (new, or replacing ended members).",
            registry=registry,
        )
        self.pool_members_deleted = Counter(
            "sandlot_operator_pool_members_deleted_total",
            "Pool members deleted, by reason (surplus, history).",
            ["reason"],
            registry=registry,
        )
        self.pool_reconcile_seconds = Histogram(
            "sandlot_operator_pool_reconcile_duration_seconds",
            "Time to reconcile one pool (routing, members, status).",
            buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10),
            registry=registry,
        )
        self.pool_ready_members = Gauge(
            "sandlot_operator_pool_ready_members",
            "A pool's Ready members waiting for a claim (its depth: what an autoscaler "
            "of the pool scales on), by pool.",
            ["namespace", "pool"],
            registry=registry,
        )
        self.claim_wait_seconds = Histogram(
            "sandlot_operator_claim_wait_seconds",
            "From the operator seeing a claim to binding it to a member (long waits: the "
            "pool is too shallow).",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
            registry=registry,
        )
        self.endpointslice_writes = Counter(
            "sandlot_operator_endpointslice_writes_total",
            "EndpointSlice applies and deletes sent for pools with a serviceName.",
            ["op"],
            registry=registry,
        )
