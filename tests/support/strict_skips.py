"""Under ``SANDLOT_REQUIRE_REAL=1`` (set by CI) a skipped test fails the run.

Tests that need containerd, the CNI plugins, helm or the control plane skip with
their reason where those parts are missing, so a developer without root still runs
the rest. In CI those parts are installed by the project itself, so a skip there
means a test silently did not run: it is reported as a failure naming the reason.
Only suites whose engine this kind of machine cannot have are exempt: tests marked
``kind`` (no Docker engine), listed in ``EXEMPT_MARKERS``, and modules listed in
``EXEMPT_MODULES`` (a module-level skip happens before its marks exist). A test
marked ``apparmor`` is exempt only where the kernel really has no AppArmor: on a
host that has it, its skip fails the run like any other.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from pathlib import Path

import pytest

VARIABLE = "SANDLOT_REQUIRE_REAL"
EXEMPT_MARKERS = frozenset({"kind"})
EXEMPT_MODULES = frozenset({"e2e/test_kind.py"})
APPARMOR_ENABLED = Path("/sys/module/apparmor/parameters/enabled")


def kernel_has_apparmor() -> bool:
    return APPARMOR_ENABLED.exists() and APPARMOR_ENABLED.read_text().strip() == "Y"


# Markers exempt only while their condition holds: what the kernel itself lacks.
EXEMPT_WHERE: dict[str, Callable[[], bool]] = {"apparmor": lambda: not kernel_has_apparmor()}


def required() -> bool:
    return os.environ.get(VARIABLE, "") not in ("", "0")


def _exempt_item(item: pytest.Item) -> bool:
    if any(item.get_closest_marker(m) is not None for m in EXEMPT_MARKERS):
        return True
    return any(
        item.get_closest_marker(m) is not None and lacking() for m, lacking in EXEMPT_WHERE.items()
    )


def _skip_reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    if not (required() and report.skipped) or _exempt_item(item):
        return
    if hasattr(report, "wasxfail"):
        return  # an expected failure is reported as skipped; it ran
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under {VARIABLE}=1, where every part this test needs must be present: "
        f"{_skip_reason(report)}"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, None]:
    outcome = yield
    report = outcome.get_result()
    if not (required() and report.skipped):
        return
    if any(report.nodeid == m or report.nodeid.startswith(m + "::") for m in EXEMPT_MODULES):
        return
    report.outcome = "failed"
    report.longrepr = (
        f"module skipped under {VARIABLE}=1, where every part it needs must be present: "
        f"{_skip_reason(report)}"
    )
