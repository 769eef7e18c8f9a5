"""``sandlot cp`` and ``sandlot port-forward`` (also as ``kubectl sandlot ...``).

Both are subresources of ``subresources.sandlot.dev`` reached through the API
server like ``sandlot exec`` (``create`` on ``sandboxes/files`` to write, ``get``
to read; ``create`` on ``sandboxes/portforward``). ``cp`` needs nothing in the
sandbox's image, not even a shell: the node's agent reads and writes the files
itself, inside the sandbox's root, and ``cli.treecopy`` walks directories. A
write replaces each file at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import threading
from typing import Any

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.streamclient import (
    Stream,
    StreamRefused,
    check_sandbox,
)
from sandlot.api.errors import UsageError
from sandlot.cli.streams import open_request
from sandlot.cli.treecopy import CopyFailed, Progress, SandboxFiles, copy_in, copy_out
from sandlot.client.commands import stdout_until_status
from sandlot.policy.streams import (
    PORTFORWARD,
    READ,
    STDIN,
    WRITE,
    StreamRequest,
    close_stdin_frame,
    encode_frame,
    end_of,
)
from sandlot.policy.treecopy import MAX_TREE_DEPTH, MAX_TREE_ENTRIES, TreeRefused

CHUNK = 64 * 1024


def register(sub: Any) -> None:
    cp = sub.add_parser(
        "cp",
        help="copy a file or a directory into or out of a sandbox",
        description="sandlot cp LOCAL SANDBOX:PATH, or sandlot cp SANDBOX:PATH LOCAL. No tar "
        "or shell needed in the image; a path outside the sandbox's root is refused. A "
        "directory is copied whole, into DEST/NAME when DEST is a directory already, else "
        f"as DEST; symlinks are skipped, never followed; at most {MAX_TREE_ENTRIES} "
        f"entries and {MAX_TREE_DEPTH} levels.",
    )
    cp.add_argument("source", metavar="SRC")
    cp.add_argument("dest", metavar="DEST")
    cp.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    cp.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    cp.set_defaults(func=run_cp)

    pf = sub.add_parser(
        "port-forward",
        help="forward a local port to a port in a sandbox",
        description="sandlot port-forward SANDBOX [LOCAL:]REMOTE: listen on LOCAL (default "
        "REMOTE) and carry each connection to REMOTE in the sandbox's network namespace.",
    )
    pf.add_argument("sandbox", metavar="SANDBOX")
    pf.add_argument("ports", metavar="[LOCAL:]REMOTE")
    pf.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    pf.add_argument("--address", default="127.0.0.1", help="local address (127.0.0.1)")
    pf.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    pf.set_defaults(func=run_port_forward)


def _remote(spec: str) -> tuple[str, str] | None:
    """(sandbox, path) of ``SANDBOX:PATH``; None for a local path."""
    name, sep, path = spec.partition(":")
    if not sep or not name or "/" in name or not path:
        return None
    return name, path


def parse_cp(source: str, dest: str) -> tuple[str, str, str, str]:
    """(direction READ|WRITE, sandbox, sandbox path, local path)."""
    src, dst = _remote(source), _remote(dest)
    if (src is None) == (dst is None):
        raise UsageError(
            "cp copies between a local path and SANDBOX:PATH: name exactly one of each"
        )
    if src is not None:
        return READ, src[0], src[1], dest
    assert dst is not None
    return WRITE, dst[0], dst[1], source


def parse_ports(spec: str) -> tuple[int, int]:
    """(local, remote) of ``[LOCAL:]REMOTE``."""
    local, _, remote = spec.rpartition(":")
    try:
        ports = (int(local or remote), int(remote))
    except ValueError:
        raise UsageError(f"ports {spec!r}: expected [LOCAL:]REMOTE, whole numbers") from None
    if not all(0 < p <= 65535 for p in ports):
        raise UsageError(f"ports {spec!r}: each from 1 to 65535")
    return ports


def run_cp(args: argparse.Namespace) -> int:
    direction, sandbox, path, local = parse_cp(args.source, args.dest)
    if direction == WRITE and not os.path.exists(local):
        raise UsageError(f"{local}: no such file or directory")
    try:
        files = SandboxFiles(args.kubeconfig, args.namespace, sandbox)
    except StreamRefused as e:
        print(f"sandlot: cp refused ({e.status}): {e.message}", file=sys.stderr)
        return 1
    progress = Progress()
    try:
        if direction == WRITE:
            copy_in(files, local, path, progress, _warn)
        else:
            copy_out(files, path, local, progress, _warn)
    except (CopyFailed, TreeRefused) as e:
        print(f"sandlot: cp: {e}", file=sys.stderr)
        if progress.plan is not None:
            print(f"sandlot: {progress.summary()}", file=sys.stderr)
        return 1
    finally:
        files.close()
    return 0


def _warn(line: str) -> None:
    print(f"sandlot: warning: {line}", file=sys.stderr)


def _carry(conn: socket.socket, stream: Stream) -> None:
    def to_sandbox() -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(CHUNK):
                stream.send(encode_frame(STDIN, data))
            stream.send(close_stdin_frame())

    threading.Thread(target=to_sandbox, daemon=True).start()
    try:
        status = stdout_until_status(stream, lambda: None, conn.sendall)
        if status is not None and (end := end_of(status)).message:
            print(f"sandlot: {end.message}", file=sys.stderr)
    except OSError:
        pass
    finally:
        stream.close()
        conn.close()


def run_port_forward(args: argparse.Namespace) -> int:
    local, remote = parse_ports(args.ports)
    request = StreamRequest(PORTFORWARD, args.namespace, args.sandbox, port=remote)
    api = load_api_client(args.kubeconfig)
    try:
        check_sandbox(api, request.namespace, request.name)
    finally:
        api.close()
    with socket.create_server((args.address, local)) as server:
        print(f"Forwarding from {args.address}:{local} -> {remote}", flush=True)
        while True:
            conn, _ = server.accept()
            try:
                stream = open_request(args.kubeconfig, request)
            except StreamRefused as e:
                print(f"sandlot: port-forward refused ({e.status}): {e.message}", file=sys.stderr)
                conn.close()
                continue
            threading.Thread(target=_carry, args=(conn, stream), daemon=True).start()
