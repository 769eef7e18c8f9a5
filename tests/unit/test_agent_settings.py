"""AgentSettings: defaults that work, bad values refused naming the setting."""

from __future__ import annotations

import argparse

import pytest

from sandlot.adapters.sandboxwatch import liveness_bound, read_timeout_for
from sandlot.agent.settings import AgentSettings
from sandlot.cli import agent_cmd
from sandlot.cli.options import SettingsError, settings_from


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    agent_cmd.register(parser.add_subparsers())
    return parser.parse_args(["agent", *argv])


def test_defaults() -> None:
    s = settings_from(AgentSettings, _parse("--node", "n1"), environ={})
    assert s.node_name == "n1"
    assert s.containerd_namespace == "sandlot"
    assert s.namespace == "sandlot-system"
    assert s.lease_duration.total_seconds() == 60
    assert s.renew_interval.total_seconds() == 10
    assert s.kill_wait.total_seconds() == 10
    assert s.teardown_bound == 30
    assert s.gc_thresholds.high_percent == 85
    # A silently dead watch is noticed within the bound, far below lease + grace (360 s).
    assert s.watch_timeout.total_seconds() == 30
    assert liveness_bound(30) == 48 < 60 + 300


def test_flags_and_environment() -> None:
    s = settings_from(
        AgentSettings,
        _parse("--node", "n1", "--kill-wait", "2s", "--pinned-image", "a", "--pinned-image", "b"),
        environ={"SANDLOT_REAP_INTERVAL": "5s", "SANDLOT_AGENT_IMAGE": "agent:1"},
    )
    assert s.kill_wait.total_seconds() == 2
    assert s.reap_interval.total_seconds() == 5
    assert s.pinned_images == ("a", "b", "agent:1")


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        ((), "--node-name"),
        (("--node", "n1", "--gc-low", "90"), "gc_low"),
        (("--node", "n1", "--renew-interval", "60s"), "renew_interval"),
        (
            ("--node", "n1", "--kill-wait", "0s"),
            "--kill-wait / SANDLOT_KILL_WAIT: .*must be positive",
        ),
        (("--node", "n1", "--kill-wait", "soon"), "--kill-wait"),
        (("--node", "n1", "--teardown-concurrency", "0"), "--teardown-concurrency"),
        (("--node", "n1", "--gc-min-free", "10", "--gc-target-free", "5"), "gc_target_free"),
        (("--node", "n1", "--watch-timeout", "300s"), "watch_timeout"),
        (("--node", "n1", "--watch-timeout", "500ms"), "watch_timeout"),
        (("--node", "n1", "--pids-limit", "0"), "--pids-limit"),
        (("--node", "n1", "--default-memory-limit", "0"), "default_memory_limit"),
        (("--node", "n1", "--default-memory-limit", "1Mi"), "default_memory_limit"),
        (("--node", "n1", "--default-memory-limit", ""), "default_memory_limit is empty"),
        (("--node", "n1", "--default-cpu-limit", ""), "default_cpu_limit is empty"),
        (
            ("--node", "n1", "--preloaded-images-verification-allowlist", "reg/x:1"),
            "--preloaded-images-verification-allowlist .*allowlist entry 'reg/x:1'",
        ),
        (
            ("--node", "n1", "--image-pull-credentials-verification-policy", "Sometimes"),
            "--image-pull-credentials-verification-policy",
        ),
    ],
    ids=[
        "node-required",
        "gc-low-below-high",
        "renew-below-lease",
        "kill-wait-positive",
        "kill-wait-is-a-duration",
        "concurrency-at-least-one",
        "target-free-above-min-free",
        "watch-timeout-far-below-the-reap-horizon",
        "watch-timeout-at-least-a-second",
        "pids-limit-0-is-not-none",
        "memory-limit-0-is-not-none",
        "memory-limit-below-the-floor",
        "memory-limit-always-set",
        "cpu-limit-always-set",
        "allowlist-entry-without-tag",
        "verification-policy-one-of-four",
    ],
)
def test_bad_values_are_refused_naming_the_setting(argv: tuple[str, ...], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        settings_from(AgentSettings, _parse(*argv), environ={})


@pytest.mark.parametrize("watch_timeout", [1, 3, 30, 120], ids=["1s", "3s", "30s", "120s"])
def test_watch_read_timeout_is_beyond_the_longest_server_timeout(watch_timeout: int) -> None:
    longest_server_timeout = watch_timeout + max(1, watch_timeout // 10)
    assert read_timeout_for(watch_timeout) > longest_server_timeout
    assert liveness_bound(watch_timeout) <= 1.6 * watch_timeout + 2
