"""The operator's /readyz answers from its first moment, against a real API server:
a slow path to the API server stretches its start-up (its first requests take
seconds), and every answer until it is ready says why it is not, never that the
check itself broke (the probe used to read controllers not built yet)."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from sandlot.devtools.controlplane import ControlPlane
from tests.support.netfault import SeveringRelay, relayed_kubeconfig
from tests.support.operator import OperatorProcess

pytestmark = pytest.mark.integration

SLOW = 2_000  # bytes a second from the API server: a TLS handshake alone takes a second


def _readyz(op: OperatorProcess) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{op.port}/readyz", timeout=2) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()
    except OSError:
        return None  # not listening yet


def test_readyz_says_why_it_is_not_ready_from_the_first_answer(
    control_plane: ControlPlane, tmp_path: Path, lease_namespace: str
) -> None:
    relay = SeveringRelay(control_plane.apiserver_port, downstream_rate=SLOW).start()
    kubeconfig = tmp_path / "slow-kubeconfig"
    relayed_kubeconfig(control_plane, relay, kubeconfig)
    op = OperatorProcess(control_plane, tmp_path, lease_namespace, kubeconfig=kubeconfig)
    answers: list[tuple[int, str]] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert op.proc.poll() is None, f"the operator exited:\n{op.log()}"
            answer = _readyz(op)
            if answer is not None:
                answers.append(answer)
                if answer[0] == 200:
                    break
            time.sleep(0.02)  # a sample interval: each answer is looked at
        assert answers and answers[-1][0] == 200, f"never ready: {answers[-3:]}"
        not_ready = [body for code, body in answers if code != 200]
        assert not_ready, "ready at the first answer: the slow start-up was not observed"
        broken = [body for body in not_ready if "check failed" in body]
        assert not broken, f"/readyz broke during start-up: {broken[:3]}"
    finally:
        op.stop()
        relay.close()
