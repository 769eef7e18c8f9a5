"""A real image registry on loopback, and a proxy that stalls: for tests, the demo
and the pull benchmark.

``docker-registry`` (the distribution project's registry 2.8, Debian package) serves
the v2 API on 127.0.0.1 at a random port with its own storage directory, optionally
behind htpasswd (basic) auth; ``skopeo`` pushes OCI archives built here
(``sandlot.devtools.ociarchive``) to it, digests preserved. ``StallingProxy`` stops
forwarding a connection's answers after a number of bytes and holds it open: a
registry that stalls mid-blob.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandlot.devtools.processes import terminate
from sandlot.devtools.tokenauth import TokenServer

LOOPBACK_HOSTS = ("127.0.0.1", "localhost")
"""The hosts these registries are reached by: the agent uses them only when its
``registry_private_hosts`` lists them."""

REGISTRY_BINARY = "docker-registry"
SKOPEO_BINARY = "skopeo"


def unavailable_reason() -> str | None:
    for binary, package in ((REGISTRY_BINARY, "docker-registry"), (SKOPEO_BINARY, "skopeo")):
        if shutil.which(binary) is None:
            return f"{binary} is not installed (Debian package {package}; scripts/bootstrap.sh)"
    return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _htpasswd_line(user: str, password: str) -> str:
    import bcrypt

    return f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5)).decode()}"


@dataclass
class Registry:
    """One running registry process; ``host`` is ``127.0.0.1:PORT``."""

    root: Path
    port: int
    users: dict[str, str] = field(default_factory=dict)
    token_server: TokenServer | None = None
    """Bearer-token auth by this server instead of htpasswd (``users`` are its users)."""
    process: subprocess.Popen[bytes] | None = None
    deletes: bool = True
    """Manifest deletes allowed (the distribution registry's default is off: 405)."""

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "registry.log"

    def ref(self, repo_tag: str) -> str:
        return f"{self.host}/{repo_tag}"

    def write_config(self) -> Path:
        storage = self.root / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        lines = [
            "version: 0.1",
            "log:",
            "  level: warn",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {storage}",
            "  delete:",
            f"    enabled: {'true' if self.deletes else 'false'}",
            "http:",
            f"  addr: {self.host}",
        ]
        if self.token_server is not None:
            lines += self.token_server.registry_config()
        elif self.users:
            htpasswd = self.root / "htpasswd"
            htpasswd.write_text("".join(_htpasswd_line(u, p) + "\n" for u, p in self.users.items()))
            lines += ["auth:", "  htpasswd:", "    realm: sandlot-test", f"    path: {htpasswd}"]
        config = self.root / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        return config

    def start(self, *, ready_timeout: float = 20.0) -> None:
        config = self.write_config()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [REGISTRY_BINARY, "serve", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"registry exited with {self.process.returncode}: {self.log_tail()}"
                )
            if self.status("/v2/") in (200, 401):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"registry on {self.host} not ready within {ready_timeout:g}s: "
                    f"{self.log_tail()}"
                )
            time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        return "(no log)"

    def status(self, path: str, *, method: str = "GET") -> int | None:
        """The HTTP status of ``path``, or None when nothing answers."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
        try:
            headers = {}
            if self.users:
                user, password = next(iter(self.users.items()))
                token = base64.b64encode(f"{user}:{password}".encode()).decode()
                headers["Authorization"] = f"Basic {token}"
            conn.request(method, path, headers=headers)
            return conn.getresponse().status
        except OSError:
            return None
        finally:
            conn.close()

    def push(self, archive: Path, repo_tag: str, *, timeout: float = 60.0) -> str:
        """Copy the OCI archive to ``repo:tag`` here; the full reference."""
        argv = [
            SKOPEO_BINARY,
            "--insecure-policy",
            "copy",
            "--quiet",
            "--dest-tls-verify=false",
            "--preserve-digests",  # the pushed image is exactly the archive built here
        ]
        if self.users:
            user, password = next(iter(self.users.items()))
            argv.append(f"--dest-creds={user}:{password}")
        argv += [f"oci-archive:{archive}", f"docker://{self.ref(repo_tag)}"]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"skopeo copy to {self.ref(repo_tag)} failed: {proc.stderr}")
        return self.ref(repo_tag)

    def stop(self, grace: float = 5.0) -> None:
        if self.process is not None:
            terminate(self.process, grace)


def start_registry(
    root: Path,
    *,
    users: dict[str, str] | None = None,
    token_server: TokenServer | None = None,
    deletes: bool = True,
) -> Registry:
    """A registry on a random loopback port; a port taken meanwhile is retried."""
    last: Exception | None = None
    for _ in range(3):
        registry = Registry(
            root=root,
            port=free_port(),
            users=dict(users or {}),
            token_server=token_server,
            deletes=deletes,
        )
        try:
            registry.start()
            return registry
        except RuntimeError as exc:  # the port was taken between probe and bind
            last = exc
    raise RuntimeError(f"no registry could start under {root}: {last}")


class StallingProxy:
    """A loopback TCP proxy to ``upstream`` that stops forwarding the answers of a
    connection after ``stall_after`` bytes, and holds it open: a registry that
    stalls mid-blob, as a broken mirror or a wedged load balancer does."""

    def __init__(self, upstream_port: int, stall_after: int) -> None:
        self.upstream_port = upstream_port
        self.stall_after = stall_after
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = [self._server]
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=5)
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, None), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(upstream, client, self.stall_after), daemon=True
            ).start()

    def _pump(self, src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                data = src.recv(16384)
                if not data:
                    return
                if limit is not None and sent + len(data) > limit:
                    dst.sendall(data[: max(limit - sent, 0)])
                    self._stop.wait()  # hold the connection open, silent
                    return
                dst.sendall(data)
                sent += len(data)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()


__all__ = [
    "Registry",
    "StallingProxy",
    "free_port",
    "start_registry",
    "unavailable_reason",
]
