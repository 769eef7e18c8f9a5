"""``AsyncClient`` and ``AsyncSandbox``: the SDK for asyncio programs.

A thin twin of the sync SDK: every call runs the sync one in a worker thread
(``asyncio.to_thread``), so the event loop never blocks and the behaviour, the
errors and the waits are exactly the sync ones. Each concurrent call holds a
thread of the loop's default executor while it runs.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from types import TracebackType
from typing import Any

from sandlot.client.client import CLAIM_TIMEOUT, CREATE_TIMEOUT, Client
from sandlot.client.commands import Channel, Result
from sandlot.client.files import FILE_TIMEOUT, FileInfo, Files
from sandlot.client.sandbox import MODE_TIMEOUT, Sandbox
from sandlot.client.snapshots import SNAPSHOT_TIMEOUT, Snapshot
from sandlot.client.tunnel import Tunnel


class AsyncFiles:
    """``Files`` in a worker thread per call."""

    def __init__(self, files: Files) -> None:
        self._files = files

    async def read(self, path: str, *, timeout: float = FILE_TIMEOUT) -> bytes:
        return await asyncio.to_thread(self._files.read, path, timeout=timeout)

    async def write(self, path: str, data: bytes | str, *, timeout: float = FILE_TIMEOUT) -> None:
        await asyncio.to_thread(self._files.write, path, data, timeout=timeout)

    async def list(self, path: str, *, timeout: float = FILE_TIMEOUT) -> list[FileInfo]:
        return await asyncio.to_thread(self._files.list, path, timeout=timeout)

    async def stat(self, path: str, *, timeout: float = FILE_TIMEOUT) -> FileInfo:
        return await asyncio.to_thread(self._files.stat, path, timeout=timeout)

    async def exists(self, path: str, *, timeout: float = FILE_TIMEOUT) -> bool:
        return await asyncio.to_thread(self._files.exists, path, timeout=timeout)

    async def mkdir(self, path: str, *, timeout: float = FILE_TIMEOUT) -> None:
        await asyncio.to_thread(self._files.mkdir, path, timeout=timeout)

    async def remove(self, path: str, *, timeout: float = FILE_TIMEOUT) -> None:
        await asyncio.to_thread(self._files.remove, path, timeout=timeout)


class AsyncSandbox:
    """``Sandbox`` for asyncio; ``sync`` is the sandbox it wraps."""

    def __init__(self, sandbox: Sandbox) -> None:
        self.sync = sandbox
        self.files = AsyncFiles(sandbox.files)

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def namespace(self) -> str:
        return self.sync.namespace

    async def run(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> Result:
        return await asyncio.to_thread(
            self.sync.run, command, timeout=timeout, env=env, cwd=cwd, stdin=stdin
        )

    async def stream(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | str | None = None,
    ) -> AsyncIterator[tuple[Channel, bytes]]:
        """``(Channel, bytes)`` as output comes, each read in a worker thread."""
        execution = await asyncio.to_thread(
            self.sync.stream, command, timeout=timeout, env=env, cwd=cwd, stdin=stdin
        )
        frames = iter(execution)
        done = object()
        try:
            while (item := await asyncio.to_thread(next, frames, done)) is not done:
                yield item  # type: ignore[misc]
        finally:
            execution.close()

    async def port(self, remote: int, *, local: int = 0, host: str = "127.0.0.1") -> Tunnel:
        """The sync ``Tunnel`` (it serves from threads of its own)."""
        return await asyncio.to_thread(self.sync.port, remote, local=local, host=host)

    async def pause(self, *, timeout: float = MODE_TIMEOUT) -> AsyncSandbox:
        """``Sandbox.pause``: frozen once this returns."""
        await asyncio.to_thread(self.sync.pause, timeout=timeout)
        return self

    async def suspend(self, *, timeout: float = MODE_TIMEOUT) -> AsyncSandbox:
        """``Sandbox.suspend``: committed and its container gone once this returns."""
        await asyncio.to_thread(self.sync.suspend, timeout=timeout)
        return self

    async def resume(self, *, timeout: float = MODE_TIMEOUT) -> AsyncSandbox:
        """``Sandbox.resume``: running again once this returns."""
        await asyncio.to_thread(self.sync.resume, timeout=timeout)
        return self

    async def snapshot(
        self, name: str | None = None, *, timeout: float = SNAPSHOT_TIMEOUT
    ) -> Snapshot:
        """``Sandbox.snapshot``: taken once this returns. The ``Snapshot`` is the sync
        one (its ``delete`` is one short call)."""
        return await asyncio.to_thread(self.sync.snapshot, name, timeout=timeout)

    async def terminate(self) -> None:
        await asyncio.to_thread(self.sync.terminate)

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.terminate()


class AsyncClient:
    """``Client`` for asyncio: the same arguments, each call in a worker thread."""

    def __init__(
        self, kubeconfig: str | os.PathLike[str] | None = None, namespace: str = "default"
    ) -> None:
        self.sync = Client(kubeconfig, namespace)

    async def get(self, name: str, *, namespace: str | None = None) -> AsyncSandbox:
        return AsyncSandbox(await asyncio.to_thread(self.sync.get, name, namespace=namespace))

    async def create(
        self,
        image: str,
        command: Sequence[str] | None = None,
        *,
        timeout: float = CREATE_TIMEOUT,
        **options: Any,
    ) -> AsyncSandbox:
        made = await asyncio.to_thread(self.sync.create, image, command, timeout=timeout, **options)
        return AsyncSandbox(made)

    async def snapshot(self, name: str, *, namespace: str | None = None) -> Snapshot:
        return await asyncio.to_thread(self.sync.snapshot, name, namespace=namespace)

    async def claim(
        self, pool: str, *, timeout: float = CLAIM_TIMEOUT, **options: Any
    ) -> AsyncSandbox:
        return AsyncSandbox(
            await asyncio.to_thread(self.sync.claim, pool, timeout=timeout, **options)
        )

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


__all__ = ["AsyncClient", "AsyncFiles", "AsyncSandbox"]
