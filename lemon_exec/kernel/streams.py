"""stdout/stderr for script cells: merged in order, flushed in bounded chunks.

ipykernel's OutStream buffers for 0.2 s without a size bound, so a tight print loop would
build one enormous stream message (memory on both sides). During a script both sys.stdout
and sys.stderr are one ChunkedStream: output keeps its order (the spec merges the two), and
every 64 KiB it flushes synchronously, which also slows a flooding script to the pace at
which IOPub drains (the IOPub socket is set to block rather than drop; see app.py).
"""

from __future__ import annotations

import io
from typing import Any

from ipykernel.iostream import OutStream

#: Fixed by the spec: output travels in chunks of at most 64 KiB.
STREAM_CHUNK_CHARS = 64 * 1024


class ChunkedStream(io.TextIOBase):
    def __init__(self, inner: Any, chunk: int = STREAM_CHUNK_CHARS) -> None:
        self._inner = inner
        self._chunk = chunk
        self._pending = 0

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        # Large writes are split so no single stream message exceeds the chunk size.
        for start in range(0, max(len(text), 1), self._chunk):
            piece = text[start : start + self._chunk]
            self._inner.write(piece)
            self._pending += len(piece)
            if self._pending >= self._chunk:
                self.flush()
        return len(text)

    def flush(self) -> None:
        self._pending = 0
        self._inner.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return int(self._inner.fileno())

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class BoundedOutStream(OutStream):
    """ipykernel's OutStream, flushed whenever 64 KiB are pending.

    It also receives what child processes write to the kernel's file descriptors (through
    ipykernel's pipe watcher), which ChunkedStream never sees; without the bound a child
    flooding its stdout would build one huge message within the 0.2 s flush interval.
    """

    _unflushed = 0

    def write(self, string: str) -> int | None:
        written = super().write(string)
        self._unflushed += len(string)
        if self._unflushed >= STREAM_CHUNK_CHARS:
            self._unflushed = 0
            self.flush()  # from a non-IO thread this waits for the send: backpressure
        return written

    def flush(self) -> None:
        self._unflushed = 0
        super().flush()
