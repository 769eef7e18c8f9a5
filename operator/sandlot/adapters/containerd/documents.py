"""An image's small JSON blobs (indexes, manifests, configs) kept by digest.

A start reads its image's config twice (its OCI spec, then the container's
snapshot parent), each time its manifest first: four streamed reads of the
content store for two documents that never change. Content is addressed by its
digest, so bytes read once for a digest are those bytes for good, whatever
happens to the image records naming them (a retag or a new pull reads the record
again and finds another digest, or the same bytes). Only the records are read per
call. The bytes are kept, not the parsed objects, so no caller shares a dict;
least recently used ones go past a budget of bytes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

DOCUMENTS_BUDGET = 4 * 1024 * 1024  # bytes of documents kept; an image's are a few KiB


class Documents:
    """Blobs by digest, at most ``budget`` bytes of them; shared by threads."""

    def __init__(self, budget: int = DOCUMENTS_BUDGET) -> None:
        self.budget = budget
        self._kept: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, digest: str) -> bytes | None:
        with self._lock:
            data = self._kept.get(digest)
            if data is not None:
                self._kept.move_to_end(digest)
            return data

    def put(self, digest: str, data: bytes) -> None:
        if len(data) > self.budget:
            return
        with self._lock:
            old = self._kept.pop(digest, None)
            self._bytes -= len(old) if old is not None else 0
            self._kept[digest] = data
            self._bytes += len(data)
            while self._bytes > self.budget:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= len(dropped)

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)


__all__ = ["DOCUMENTS_BUDGET", "Documents"]
