"""Shared fixtures: the real control plane (tests/support/kube.py) and the real
containerd (tests/support/containerd_fixtures.py)."""

pytest_plugins = [
    "tests.support.kube",
    "tests.support.containerd_fixtures",
    "tests.support.operator",
]
