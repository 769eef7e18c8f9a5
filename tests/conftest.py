"""Shared fixtures: the real control plane (tests/support/kube.py) and the real
containerd (tests/support/containerd_fixtures.py), the runtime handler rig
(tests/support/runtimeclasses.py), the pool tests' cluster of real agents
(tests/support/pools.py); under SANDLOT_REQUIRE_REAL=1 a skip fails the run
(tests/support/strict_skips.py)."""

pytest_plugins = [
    "tests.support.kube",
    "tests.support.containerd_fixtures",
    "tests.support.registry",
    "tests.support.agentpulls",
    "tests.support.operator",
    "tests.support.faultplane",
    "tests.support.strict_skips",
    "tests.support.streams",
    "tests.support.runtimeclasses",
    "tests.support.agentrig",
    "tests.support.pools",
]
