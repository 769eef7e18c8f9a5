"""What each MCP tool does: its arguments become ``sandlot.client`` calls, and the
SDK's results and errors become what a model reads.

Kept free of the ``mcp`` package so it is tested against a fake ``Client``. Every
SDK error becomes a ``ToolFailure`` that says what happened and what to do next.
Everything returned lands in a model's context, so it is bounded: each output
stream and a file's content at ``OUTPUT_CAP`` bytes, a listing at its ``limit``,
with a note saying what was cut. A command's output is kept as it streams, so the
cap bounds this process's memory too; what lies past it is counted, not kept.

A server started with ``--namespace`` is confined to it: a call naming any other
namespace is refused before anything is sent, so a model steered by what it read
in one sandbox cannot act in the kubeconfig identity's other namespaces.

No state is held between calls: each names its sandbox, which is read again (one
GET), and a claimed sandbox (the claim's label on it) is released by deleting
its claim, as ``Sandbox.terminate`` does for one the SDK claimed itself.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from sandlot.api.keys import CLAIM_LABEL
from sandlot.client import (
    Channel,
    Client,
    CommandError,
    FileError,
    Forbidden,
    Sandbox,
    SandboxGone,
    SandboxNotFound,
    SandlotError,
    TimedOut,
)
from sandlot.client.client import CLAIM_TIMEOUT, CREATE_TIMEOUT

OUTPUT_CAP = 1 << 20  # bytes of stdout, of stderr, and of a file's content returned
RUN_TIMEOUT = 120.0  # seconds a command may run when the call names no timeout
FILE_TIMEOUT = 120.0  # seconds one file operation may take
MAX_TIMEOUT = 3600.0  # seconds: the longest wait a call may ask for
LIST_LIMIT = 500  # directory entries returned when the call names no limit
MAX_LIST_LIMIT = 5000

Name = Annotated[
    str, Field(description="the sandbox's name, as create_sandbox or claim_sandbox returned it")
]
Namespace = Annotated[
    str | None,
    Field(
        description="the namespace (default: the server's; a server started with "
        "--namespace acts in that one only)"
    ),
]
FilePath = Annotated[str, Field(description="an absolute path inside the sandbox")]


class ToolFailure(Exception):
    """A failure to show the model as the tool's error: what happened, what to do."""


class SandboxRef(BaseModel):
    sandbox: str = Field(description="the sandbox's name: pass it to the other tools")
    namespace: str
    claim: str | None = Field(default=None, description="the SandboxClaim holding it, if claimed")


class CommandOutput(BaseModel):
    exit_code: int
    stdout: str = Field(description="UTF-8, undecodable bytes replaced")
    stderr: str = Field(description="UTF-8, undecodable bytes replaced")
    note: str | None = Field(default=None, description="what was cut, and how to see the rest")


class FileContent(BaseModel):
    path: str
    content: str
    encoding: Literal["utf-8", "base64"] = Field(description="base64 when not UTF-8 text")
    size: int = Field(description="bytes the file holds")
    note: str | None = None


class FileWritten(BaseModel):
    path: str
    size: int = Field(description="bytes written")


class FileEntry(BaseModel):
    name: str
    type: str = Field(description='"file", "dir", "symlink" or "other"')
    size: int = Field(description="bytes")
    mode: str = Field(description="permission bits, octal")
    mtime: int = Field(description="seconds since the epoch")


class Listing(BaseModel):
    path: str
    entries: list[FileEntry] = Field(description="sorted by name")
    total: int = Field(description="entries the directory holds")
    note: str | None = None


class Released(BaseModel):
    sandbox: str
    namespace: str
    deleted: str = Field(description="what was deleted: the claim when claimed, else the sandbox")


def advice(error: SandlotError) -> str:
    """What a model should do about ``error``."""
    if isinstance(error, SandboxNotFound):
        return "Check the name and the namespace: create_sandbox and claim_sandbox return both."
    if isinstance(error, Forbidden):
        return (
            "The kubeconfig's identity lacks this right in that namespace, so retrying will "
            "not help: use a namespace where it has sandlot's edit role, or ask for that role."
        )
    if isinstance(error, SandboxGone):
        return "Its processes and files are lost; create_sandbox or claim_sandbox gives a new one."
    if isinstance(error, TimedOut):
        return "Retry with a longer timeout."
    if isinstance(error, FileError):
        return {
            404: "No such file or directory: look with list_files.",
            403: "Outside the sandbox's root or not permitted: use a path the sandbox's user owns.",
            413: "Over the agent's transfer cap: move it in smaller parts.",
            400: "A directory where a file was meant (or the other way round): look with list_files.",
        }.get(error.status, "")
    if isinstance(error, CommandError):
        return (
            "Check that the program exists in the image (an absolute path, or a name on its "
            "PATH); for shell syntax run ['sh', '-c', '...'] in an image that has a shell."
        )
    return ""


def describe(error: SandlotError) -> str:
    said = str(error).rstrip(". ")
    return " ".join(part for part in (f"{type(error).__name__}: {said}.", advice(error)) if part)


@contextmanager
def failures(timed_out: str | None = None) -> Iterator[None]:
    """SDK errors (and arguments it refused) as ``ToolFailure``; ``timed_out``
    replaces the advice for a ``TimedOut``."""
    try:
        yield
    except TimedOut as e:
        if timed_out is None:
            raise ToolFailure(describe(e)) from e
        raise ToolFailure(f"TimedOut: {str(e).rstrip('. ')}. {timed_out}") from e
    except SandlotError as e:
        raise ToolFailure(describe(e)) from e
    except ValueError as e:
        raise ToolFailure(f"Invalid arguments: {e}") from e


class Capture:
    """One stream's output as it comes: the first ``cap`` bytes kept, the rest counted."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.seen = 0

    def add(self, data: bytes) -> None:
        self.seen += len(data)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    @property
    def text(self) -> str:
        return self.kept.decode(errors="replace")

    def cut(self, what: str) -> str | None:
        if self.seen <= self.cap:
            return None
        return f"{what} was cut to its first {len(self.kept)} of {self.seen} bytes"


def as_text(data: bytes) -> tuple[str, Literal["utf-8", "base64"]]:
    """``data`` as UTF-8 text when it is (a character cut at its end aside), else base64."""
    try:
        return data.decode(), "utf-8"
    except UnicodeDecodeError as e:
        if e.reason == "unexpected end of data" and len(data) - e.start < 4:
            return data[: e.start].decode(), "utf-8"
        return base64.b64encode(data).decode(), "base64"


class SandboxTools:
    """The tools, acting through ``client`` (the kubeconfig's identity); a call that
    names no namespace uses ``namespace``, and when ``confined`` a call naming
    another is refused."""

    def __init__(self, client: Client, namespace: str, *, confined: bool = False) -> None:
        self.client = client
        self.namespace = namespace
        self.confined = confined

    def _namespace(self, namespace: str | None) -> str:
        """The namespace a call acts in; a ``ToolFailure`` when it leaves the confinement."""
        if not namespace or namespace == self.namespace or not self.confined:
            return namespace or self.namespace
        raise ToolFailure(
            f'Refused: this server is confined to namespace "{self.namespace}" '
            f'(sandlot mcp --namespace) and does not act in namespace "{namespace}". '
            f'Omit the namespace, or name "{self.namespace}".'
        )

    def _sandbox(self, name: str, namespace: str | None) -> Sandbox:
        sandbox = self.client.get(name, namespace=self._namespace(namespace))
        labels = (sandbox.body.get("metadata") or {}).get("labels") or {}
        sandbox.claim = sandbox.claim or labels.get(CLAIM_LABEL)
        return sandbox

    def create_sandbox(
        self,
        image: Annotated[str, Field(description="the container image, e.g. python:3.12-slim")],
        command: Annotated[
            list[str] | None,
            Field(description="argv to run as the sandbox's main process (default: the image's)"),
        ] = None,
        namespace: Namespace = None,
        timeout: Annotated[
            float, Field(gt=0, le=MAX_TIMEOUT, description="seconds to wait for it to run")
        ] = CREATE_TIMEOUT,
    ) -> SandboxRef:
        """Start a new sandbox from an image and wait until it runs. Returns its name,
        which the other tools take. Terminate it when done. To run commands in it, the
        main process must keep running: for an image whose default command exits, pass
        one that waits, e.g. ["sleep", "infinity"]."""
        where = self._namespace(namespace)
        with failures("Nothing was left behind; retry with a longer timeout."):
            made = self.client.create(image, command, namespace=where, timeout=timeout)
        return SandboxRef(sandbox=made.name, namespace=made.namespace)

    def claim_sandbox(
        self,
        pool: Annotated[str, Field(description="the SandboxPool to take a warm sandbox from")],
        namespace: Namespace = None,
        timeout: Annotated[
            float, Field(gt=0, le=MAX_TIMEOUT, description="seconds to wait for one")
        ] = CLAIM_TIMEOUT,
    ) -> SandboxRef:
        """Take a ready sandbox from a pool (faster than create_sandbox) through a new
        SandboxClaim. Returns the sandbox's name and the claim's; terminate_sandbox
        releases both."""
        where = self._namespace(namespace)
        with failures(
            "The claim was released; retry with a longer timeout, or the pool may have "
            "no free member now."
        ):
            got = self.client.claim(pool, namespace=where, timeout=timeout)
        return SandboxRef(sandbox=got.name, namespace=got.namespace, claim=got.claim)

    def run_command(
        self,
        sandbox: Name,
        command: Annotated[
            list[str],
            Field(
                min_length=1,
                description='argv, run as it is: for shell syntax ["sh", "-c", "a | b"]',
            ),
        ],
        timeout: Annotated[
            float,
            Field(gt=0, le=MAX_TIMEOUT, description="seconds before the command is ended"),
        ] = RUN_TIMEOUT,
        stdin: Annotated[str | None, Field(description="text sent to its stdin")] = None,
        namespace: Namespace = None,
    ) -> CommandOutput:
        """Run a command in a sandbox to its end: stdout, stderr and exit code (a
        non-zero exit is a result, not an error). Each output is cut at 1 MiB."""
        out, err = Capture(OUTPUT_CAP), Capture(OUTPUT_CAP)
        with failures():
            execution = self._sandbox(sandbox, namespace).stream(
                command, timeout=timeout, stdin=stdin
            )
            try:
                with execution:
                    for channel, data in execution:
                        (out if channel == Channel.STDOUT else err).add(data)
            except TimedOut as e:
                raise ToolFailure(
                    f"TimedOut: {e}. Give it a longer timeout, or start it in the background "
                    "(['sh', '-c', 'nohup CMD >/tmp/out 2>&1 &']) and read /tmp/out later. "
                    f"The end of its output until then:\nstdout: {out.text[-4096:]!r}\n"
                    f"stderr: {err.text[-4096:]!r}"
                ) from e
        cuts = [c for c in (out.cut("stdout"), err.cut("stderr")) if c]
        note = None
        if cuts:
            note = (
                "; ".join(cuts) + ". To see the rest, redirect it to a file in the sandbox "
                "and read parts of it (head -c, tail -c, grep)."
            )
        exit_code = execution.exit_code if execution.exit_code is not None else -1
        return CommandOutput(exit_code=exit_code, stdout=out.text, stderr=err.text, note=note)

    def read_file(self, sandbox: Name, path: FilePath, namespace: Namespace = None) -> FileContent:
        """Read a file in a sandbox (no shell needed in the image): UTF-8 text as it
        is, anything else in base64. Content past 1 MiB is cut."""
        with failures():
            data = self._sandbox(sandbox, namespace).files.read(path, timeout=FILE_TIMEOUT)
        content, encoding = as_text(data[:OUTPUT_CAP])
        note = None
        if len(data) > OUTPUT_CAP:
            note = (
                f"cut to its first {OUTPUT_CAP} of {len(data)} bytes; read parts of it with "
                "run_command (head -c, tail -c, sed -n)"
            )
        return FileContent(path=path, content=content, encoding=encoding, size=len(data), note=note)

    def write_file(
        self,
        sandbox: Name,
        path: FilePath,
        content: Annotated[str, Field(description="the file's whole new content")],
        encoding: Annotated[
            Literal["utf-8", "base64"], Field(description="how content is given")
        ] = "utf-8",
        namespace: Namespace = None,
    ) -> FileWritten:
        """Write a file in a sandbox, replacing it at once (its directory must exist;
        owned by the sandbox's user)."""
        if encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except ValueError as e:
                raise ToolFailure(f"Invalid arguments: content is not base64 ({e})") from e
        else:
            data = content.encode()
        with failures():
            self._sandbox(sandbox, namespace).files.write(path, data, timeout=FILE_TIMEOUT)
        return FileWritten(path=path, size=len(data))

    def list_files(
        self,
        sandbox: Name,
        path: FilePath,
        limit: Annotated[
            int, Field(gt=0, le=MAX_LIST_LIMIT, description="most entries to return")
        ] = LIST_LIMIT,
        namespace: Namespace = None,
    ) -> Listing:
        """List a directory in a sandbox: each entry's name, type, size, mode and mtime."""
        with failures():
            found = self._sandbox(sandbox, namespace).files.list(path, timeout=FILE_TIMEOUT)
        found = sorted(found, key=lambda info: info.name)
        entries = [
            FileEntry(name=i.name, type=i.type, size=i.size, mode=f"{i.mode:04o}", mtime=i.mtime)
            for i in found[:limit]
        ]
        note = None
        if len(found) > limit:
            note = f"the first {limit} of {len(found)} entries; list with a higher limit for more"
        return Listing(path=path, entries=entries, total=len(found), note=note)

    def terminate_sandbox(self, sandbox: Name, namespace: Namespace = None) -> Released:
        """Release a sandbox: delete its claim when it was claimed, else the sandbox.
        Its processes and files are gone after this."""
        with failures():
            found = self._sandbox(sandbox, namespace)
            found.terminate()
        deleted = f"sandboxclaim {found.claim}" if found.claim else f"sandbox {found.name}"
        return Released(sandbox=found.name, namespace=found.namespace, deleted=deleted)


TOOLS = (
    "create_sandbox",
    "claim_sandbox",
    "run_command",
    "read_file",
    "write_file",
    "list_files",
    "terminate_sandbox",
)

__all__ = [
    "OUTPUT_CAP",
    "TOOLS",
    "CommandOutput",
    "FileContent",
    "FileWritten",
    "Listing",
    "Released",
    "SandboxRef",
    "SandboxTools",
    "ToolFailure",
    "as_text",
    "describe",
]
