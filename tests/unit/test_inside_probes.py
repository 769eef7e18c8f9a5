"""What a tcpSocket or httpGet probe runs inside a sandbox the node cannot enter
(gVisor): plain data."""

from __future__ import annotations

from sandlot.agent.proberun import inside_probe_argv
from sandlot.api.probe import Probe


def test_a_tcp_probe_connects_with_nc_within_its_timeout() -> None:
    probe = Probe.model_validate({"tcpSocket": {"port": 8080}, "timeoutSeconds": 3})
    assert inside_probe_argv(probe, 3.0) == ["nc", "-w", "3", "127.0.0.1", "8080"]
    assert inside_probe_argv(probe, 0.2)[2] == "1"  # never a zero wait


def test_an_http_probe_fetches_its_path_with_wget() -> None:
    probe = Probe.model_validate({"httpGet": {"path": "/healthz", "port": 9000}})
    argv = inside_probe_argv(probe, 1.0)
    assert argv[0] == "wget" and argv[-1] == "http://127.0.0.1:9000/healthz"
    assert "-T" not in argv  # busybox's wget -T crashes under gVisor: the exec bounds it
