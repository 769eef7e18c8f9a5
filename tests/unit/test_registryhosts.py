"""adapters.pulling.hosts: containerd's hosts.toml conventions, and the pull-path seam."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.adapters.pulling.hosts import HostsConfigError, endpoints_for
from sandlot.policy.pulling.reference import parse_reference


@pytest.mark.parametrize(
    ("image", "url"),
    [
        ("busybox", "https://registry-1.docker.io"),
        ("ghcr.io/a/b", "https://ghcr.io"),
        ("localhost:5000/a", "http://localhost:5000"),
        ("127.0.0.1:5000/a", "http://127.0.0.1:5000"),
    ],
    ids=["docker-hub", "https-by-default", "localhost-plain-http", "loopback-plain-http"],
)
def test_without_configuration(image: str, url: str) -> None:
    assert [e.url for e in endpoints_for(parse_reference(image), None)] == [url]


def test_mirrors_come_first_in_file_order_then_the_server(tmp_path: Path) -> None:
    host_dir = tmp_path / "reg.example:5000"
    host_dir.mkdir()
    (host_dir / "hosts.toml").write_text(
        'server = "https://reg.example:5000"\n'
        'ca = "/etc/ca/reg.pem"\n'
        '[host."https://mirror.internal"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        '  ca = ["/etc/ca/mirror.pem"]\n'
        '[host."http://push-only.internal"]\n'
        '  capabilities = ["push"]\n'
        '[host."http://plain.internal:5000"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        "  skip_verify = true\n"
    )
    endpoints = endpoints_for(parse_reference("reg.example:5000/app:1"), str(tmp_path))
    assert [(e.url, e.ca_file, e.skip_verify) for e in endpoints] == [
        ("https://mirror.internal", "/etc/ca/mirror.pem", False),
        ("http://plain.internal:5000", None, True),
        ("https://reg.example:5000", "/etc/ca/reg.pem", False),
    ]


def test_default_directory_serves_registries_without_their_own(tmp_path: Path) -> None:
    (tmp_path / "_default").mkdir()
    (tmp_path / "_default" / "hosts.toml").write_text('[host."http://cache.internal"]\n')
    endpoints = endpoints_for(parse_reference("quay.io/a/b"), str(tmp_path))
    assert [e.url for e in endpoints] == ["http://cache.internal", "https://quay.io"]


def test_unreadable_hosts_file_names_itself(tmp_path: Path) -> None:
    (tmp_path / "quay.io").mkdir()
    (tmp_path / "quay.io" / "hosts.toml").write_text("server = [unclosed\n")
    with pytest.raises(HostsConfigError, match=r"quay\.io/hosts\.toml"):
        endpoints_for(parse_reference("quay.io/a/b"), str(tmp_path))


@pytest.mark.parametrize(
    ("transfer_offered", "agent_hosts", "method"),
    [
        (False, False, "client-side"),
        (False, True, "client-side"),
        (True, True, "client-side"),
        (True, False, "transfer"),
    ],
    ids=[
        "1.6-no-transfer-service",
        "1.6-with-mirrors",
        "2.x-with-mirrors-or-private-ca",
        "2.x-registry-itself",
    ],
)
def test_pull_path_is_chosen_by_what_the_daemon_offers(
    transfer_offered: bool, agent_hosts: bool, method: str
) -> None:
    pull = pytest.importorskip("sandlot.adapters.pulling.puller")
    assert pull.pull_method(transfer_offered=transfer_offered, agent_hosts=agent_hosts) == method
