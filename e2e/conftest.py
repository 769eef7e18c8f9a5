"""On a failed e2e scenario, the cluster's state goes into the test's report: the
sandboxes, the chart's pods, the recent events and the tail of every chart pod's
log (the previous container's too), read while the cluster still runs."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

LOG_TAIL = 80


def _diagnostics(cluster: Any) -> str:
    from e2e.scenarios import NAMESPACE

    parts = []
    for title, args in [
        (
            "sandboxes",
            ["get", "sandboxes.sandlot.dev,sandboxnodes.sandlot.dev", "-A", "-o", "wide"],
        ),
        ("pods", ["get", "pods", "-A", "-o", "wide"]),
        ("leases", ["get", "leases", "-A"]),
        ("events", ["get", "events", "-A", "--sort-by=.lastTimestamp"]),
    ]:
        parts.append(f"--- {title}\n{cluster.kubectl(*args, check=False)}")
    for pod in cluster.chart_pods():
        name = pod.metadata.name
        for previous in (False, True):
            args = ["logs", "-n", NAMESPACE, name, "--all-containers", f"--tail={LOG_TAIL}"]
            text = cluster.kubectl(*args, *(["--previous"] if previous else []), check=False)
            if text.strip():
                parts.append(f"--- {name}{' (previous)' if previous else ''}\n{text}")
    return "\n".join(parts)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and call.when == "call" and cluster is not None:
        try:
            report.sections.append(("cluster state", _diagnostics(cluster)))
        except Exception as e:  # the report itself must not fail
            report.sections.append(("cluster state", f"could not be read: {e!r}"))
    return report
