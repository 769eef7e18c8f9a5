"""A TCP relay that can make its connections die silently.

A watch whose connection dies without a FIN or RST (a peer that vanished, a
dropped NAT or load-balancer entry, a host that froze and came back behind a new
address) gets nothing: no event, no end, no error. Only a read timeout notices.
``sever_silently`` does exactly that to every connection open at that moment:
they stay open on both sides and every byte sent on them is dropped. Connections
made afterwards are relayed normally, as a client that reconnects finds a working
path again. The bytes are TLS and are never looked at.

``downstream_rate`` slows what the server sends to at most that many bytes a second
per connection: a big LIST then takes seconds, as it does at fleet scale or over a
congested link, while small requests (a Lease renewal, a few objects) stay quick.

``cut`` is an outage: every open connection goes silent and every new one is
closed as it arrives, until ``restore`` (which may set a new ``downstream_rate``
for the connections made from then on: a path that comes back congested).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path

import yaml

from sandlot.devtools.controlplane import ADMIN_USER, ControlPlane, kubeconfig_dict


class SeveringRelay:
    """Relays 127.0.0.1:``port`` to ``target_port``; start with ``start()``."""

    def __init__(
        self,
        target_port: int,
        target_host: str = "127.0.0.1",
        *,
        downstream_rate: float | None = None,
    ) -> None:
        if downstream_rate is not None and downstream_rate <= 0:
            raise ValueError(f"downstream_rate must be positive, got {downstream_rate}")
        self.target = (target_host, target_port)
        self.downstream_rate = downstream_rate
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._generation = 0
        self._severed_below = 0
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        self._refusing = threading.Event()

    def start(self) -> SeveringRelay:
        threading.Thread(target=self._accept, name="relay-accept", daemon=True).start()
        return self

    def sever_silently(self) -> int:
        """Every connection made so far goes silent; returns how many were made."""
        with self._lock:
            self._severed_below = self._generation
        return self._generation

    def cut(self) -> int:
        """An outage begins: open connections go silent, new ones are closed at once."""
        self._refusing.set()
        return self.sever_silently()

    def restore(self, downstream_rate: float | None = None) -> None:
        """The outage ends; connections made from now on get ``downstream_rate``."""
        if downstream_rate is not None and downstream_rate <= 0:
            raise ValueError(f"downstream_rate must be positive, got {downstream_rate}")
        self.downstream_rate = downstream_rate
        self._refusing.clear()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()

    def _silent(self, generation: int) -> bool:
        with self._lock:
            return generation < self._severed_below

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self._refusing.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                generation = self._generation
                self._generation += 1
                self._sockets += [client, upstream]
            for src, dst, rate in (
                (client, upstream, None),
                (upstream, client, self.downstream_rate),
            ):
                threading.Thread(
                    target=self._pump, args=(src, dst, generation, rate), daemon=True
                ).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, generation: int, rate: float | None
    ) -> None:
        chunk = 65536 if rate is None else max(1024, int(rate / 20))
        while not self._closed.is_set():
            try:
                data = src.recv(chunk)
            except OSError:
                data = b""
            if self._silent(generation):
                if not data:
                    return  # the far side closed; this side never hears of it
                continue  # dropped: the connection is a black hole
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            try:
                dst.sendall(data)
            except OSError:
                return
            if rate is not None:
                time.sleep(len(data) / rate)


def relayed_kubeconfig(plane: ControlPlane, relay: SeveringRelay, target: Path) -> Path:
    """A kubeconfig at ``target`` for ``plane``'s admin that reaches it through ``relay``."""
    config = kubeconfig_dict(
        f"https://127.0.0.1:{relay.port}", str(plane.ca_file), ADMIN_USER, token=plane.admin_token
    )
    target.write_text(yaml.safe_dump(config))
    return target


__all__ = ["SeveringRelay", "relayed_kubeconfig"]
