"""``serve_port``'s answer when the sandbox side cannot connect: a port reached
through the container's own ``nc`` (a handler with no host view) that fails says
why in the status, instead of ending as an empty success."""

from __future__ import annotations

import json
import queue
from typing import Any

from sandlot.agent.containerfiles import PortUnreachable
from sandlot.agent.filesessions import serve_port
from sandlot.policy.streams import PORTFORWARD, STATUS, STDOUT, StreamRequest, decode_frame

WHY = "nc: can't connect to remote host (127.0.0.1): Network is unreachable"


class _Gateway:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.incoming: queue.Queue[bytes] = queue.Queue()

    def send(self, message: bytes) -> None:
        self.sent.append(message)

    def recv(self, timeout: float | None = None) -> bytes:
        try:
            return self.incoming.get(timeout=0)
        except queue.Empty:
            raise TimeoutError from None

    def close(self) -> None:
        pass

    def frames(self, wanted: int) -> bytes:
        return b"".join(d for c, d in (decode_frame(m) for m in self.sent) if c == wanted)


class _Port:
    def __init__(self, *answers: bytes | Exception) -> None:
        self.answers = list(answers)

    def recv(self, size: int) -> bytes:
        answer = self.answers.pop(0) if self.answers else b""
        if isinstance(answer, Exception):
            raise answer
        return answer

    def sendall(self, data: bytes) -> None:
        pass

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        pass


def _serve(port: Any) -> _Gateway:
    gateway = _Gateway()
    asked = StreamRequest(PORTFORWARD, "ns", "sb", port=8080)
    serve_port(gateway, asked, lambda: port, timeout=1, idle=5, running=lambda: True)
    return gateway


def test_a_port_the_container_cannot_reach_is_a_failure_naming_why() -> None:
    status = json.loads(_serve(_Port(PortUnreachable(WHY))).frames(STATUS))
    assert status["status"] == "Failure" and status["code"] == 502, status
    assert status["message"] == f"port 8080: {WHY}"


def test_a_port_that_answered_and_closed_is_a_success() -> None:
    gateway = _serve(_Port(b"HTTP/1.0 200 OK\r\n\r\nhi", b""))
    assert gateway.frames(STDOUT) == b"HTTP/1.0 200 OK\r\n\r\nhi"
    assert json.loads(gateway.frames(STATUS))["status"] == "Success"


def test_a_reset_from_a_socket_stays_an_ordinary_end() -> None:
    status = json.loads(_serve(_Port(ConnectionResetError("reset"))).frames(STATUS))
    assert status["status"] == "Success", status
