"""``sandlot logs`` and ``sandlot exec`` (also ``kubectl sandlot logs|exec``).

Both are subresources of the aggregated API ``subresources.sandlot.dev``, reached
through the API server (``adapters.streamclient``) and authorized by RBAC
(``policy.streams``): ``get sandboxes/log`` for logs, ``create sandboxes/exec``
for exec. The exit code of an
exec is the command's; a refusal is one line with the reason and exit 1.

``--previous`` is refused: sandlot runs a sandbox's container once and never
restarts it (a pool replaces an ended sandbox with a new Sandbox), so there is no
previous instance whose output could be kept.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Mapping
from typing import Any, BinaryIO

from sandlot.adapters.kube import load_api_client
from sandlot.adapters.startup import api_error_line
from sandlot.adapters.streamclient import (
    Stream,
    StreamRefused,
    check_sandbox,
    is_forbidden,
    open_stream,
)
from sandlot.api.errors import UsageError
from sandlot.policy.streams import (
    EXEC,
    LOG,
    STATUS,
    STDERR,
    STDIN,
    STDOUT,
    StreamRequest,
    api_path,
    close_stdin_frame,
    decode_frame,
    encode_frame,
    end_of,
    resize_frame,
)

RESIZE_LOOK = 0.5  # seconds between looks for a resize, and for the end of the stream
PREVIOUS_REFUSED = (
    "--previous: sandlot never restarts a sandbox's container (a pool replaces an ended "
    "sandbox with a new one), so there is no previous instance to show"
)


def register(sub: Any) -> None:
    logs = sub.add_parser(
        "logs",
        help="print a sandbox's output",
        description="Print a running sandbox's stdout and stderr, served by its node's agent "
        "through the API server (needs `get` on sandboxes/log in subresources.sandlot.dev).",
    )
    logs.add_argument("sandbox", metavar="SANDBOX", help="Sandbox name")
    logs.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing new output")
    logs.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    logs.add_argument("-p", "--previous", action="store_true", help="refused: see the help")
    logs.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    logs.set_defaults(func=run_logs)

    exe = sub.add_parser(
        "exec",
        help="run a command in a sandbox",
        description="Run a command in a running sandbox's container (needs `create` on "
        "sandboxes/exec in subresources.sandlot.dev); exits with the command's exit code. sandlot exec SANDBOX [-it] -- CMD...",
    )
    exe.add_argument("sandbox", metavar="SANDBOX", help="Sandbox name")
    exe.add_argument("-n", "--namespace", default="default", help="namespace (default)")
    exe.add_argument("-i", "--stdin", action="store_true", help="pass stdin to the command")
    exe.add_argument("-t", "--tty", action="store_true", help="run the command in a terminal")
    exe.add_argument("--kubeconfig", default=None, help="kubeconfig file")
    exe.add_argument("command", nargs="*", metavar="CMD", help="the command, after --")
    exe.set_defaults(func=run_exec)


def log_request(args: argparse.Namespace) -> StreamRequest:
    if args.previous:
        raise UsageError(PREVIOUS_REFUSED)
    if args.tail is not None and args.tail < 0:
        raise UsageError("--tail must not be negative")
    return StreamRequest(LOG, args.namespace, args.sandbox, follow=args.follow, tail=args.tail)


def exec_request(args: argparse.Namespace) -> StreamRequest:
    command = [*args.command, *(getattr(args, "trailing", None) or [])]
    if not command:
        raise UsageError("exec needs a command: sandlot exec SANDBOX -- CMD [ARG...]")
    return StreamRequest(
        EXEC, args.namespace, args.sandbox, command=tuple(command), tty=args.tty, stdin=args.stdin
    )


def open_request(kubeconfig: str | None, request: StreamRequest) -> Stream:
    """The stream of ``request`` through the API server; ``StreamRefused`` when the
    API server or the gateway refuses it (a 403 of the sandbox's read included)."""
    api = load_api_client(kubeconfig)
    try:
        check_sandbox(api, request.namespace, request.name)
        return open_stream(api, api_path(request))
    except Exception as e:
        if is_forbidden(e):
            raise StreamRefused(403, api_error_line(e)) from None
        raise
    finally:
        api.close()


def _connect(args: argparse.Namespace, request: StreamRequest) -> Stream | int:
    try:
        return open_request(args.kubeconfig, request)
    except StreamRefused as e:
        print(f"sandlot: {request.kind} refused ({e.status}): {e.message}", file=sys.stderr)
        return 1


def _console() -> dict[int, BinaryIO]:
    return {STDOUT: sys.stdout.buffer, STDERR: sys.stderr.buffer}


def relay(stream: Stream, outputs: Mapping[int, BinaryIO]) -> int:
    """Write the frames of ``outputs``' channels out until the stream ends; the exit
    code its status gives."""
    status: bytes | None = None
    while (message := stream.recv()) is not None:
        channel, data = decode_frame(message)
        if channel in outputs:
            outputs[channel].write(data)
            outputs[channel].flush()
        elif channel == STATUS:
            status = data
    end = end_of(status)
    if end.message:
        print(f"sandlot: {end.message}", file=sys.stderr)
    return end.exit_code


def run_logs(args: argparse.Namespace) -> int:
    stream = _connect(args, log_request(args))
    if isinstance(stream, int):
        return stream
    try:
        return relay(stream, _console())
    finally:
        stream.close()


def run_exec(args: argparse.Namespace) -> int:
    request = exec_request(args)
    stream = _connect(args, request)
    if isinstance(stream, int):
        return stream
    try:
        with _terminal(stream, request.tty):
            if request.stdin:
                threading.Thread(target=_send_stdin, args=(stream,), daemon=True).start()
            return relay(stream, _console())
    finally:
        stream.close()


def _send_stdin(stream: Stream) -> None:
    fd = sys.stdin.fileno()
    with contextlib.suppress(OSError):
        while data := os.read(fd, 32 * 1024):
            stream.send(encode_frame(STDIN, data))
        stream.send(close_stdin_frame())


@contextlib.contextmanager
def _terminal(stream: Stream, tty: bool) -> Any:
    """With ``-t`` on a terminal: raw mode, and the size sent now and on every SIGWINCH."""
    if not (tty and sys.stdin.isatty()):
        yield
        return
    import termios
    import tty as ttymode

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    resized, done = threading.Event(), threading.Event()

    def send_sizes() -> None:
        # Sent from a thread of its own, never from the handler: the handler runs on
        # the main thread inside its TLS read of the same connection, and a write
        # there re-enters the TLS session mid-read (a resize then got lost).
        while not done.is_set():
            if resized.wait(RESIZE_LOOK):
                resized.clear()
                size = os.get_terminal_size(fd)
                with contextlib.suppress(OSError):
                    stream.send(resize_frame(size.columns, size.lines))

    previous = signal.signal(signal.SIGWINCH, lambda *_: resized.set())
    resized.set()  # the size now
    sender = threading.Thread(target=send_sizes, name="resize", daemon=True)
    sender.start()
    ttymode.setraw(fd)
    try:
        yield
    finally:
        done.set()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, previous)
        sender.join(RESIZE_LOOK * 2)
