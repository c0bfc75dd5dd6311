"""A script's merged output stream is never flushed by the garbage collector.

ChunkedStream and its ``buffer`` form a reference cycle, so the collector frees them at an
arbitrary later moment, possibly inside the next cell's write to ipykernel's OutStream,
which holds the stream's lock. io's finalizer closes (and so flushes) a stream; a flush
from there waits for the IO thread, which waits for that lock: the kernel deadlocked (a
per-call run hung until its timeout). The kernel flushes the stream when the cell ends.
Pure logic: the inner stream only records calls.
"""

from __future__ import annotations

import gc

from lemon_exec.kernel.streams import ChunkedStream


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def write(self, text: str) -> int:
        self.calls.append("write")
        return len(text)

    def flush(self) -> None:
        self.calls.append("flush")


def test_a_collected_stream_does_not_flush() -> None:
    inner = _Recorder()
    stream = ChunkedStream(inner)
    stream.write("x")
    stream.buffer.write(b"y")
    del stream
    gc.collect()  # the cycle with its buffer: freed only by the collector
    assert inner.calls == ["write", "write"]


def test_flush_and_close_still_flush() -> None:
    inner = _Recorder()
    stream = ChunkedStream(inner)
    stream.write("x")
    stream.buffer.flush()
    assert inner.calls == ["write", "flush"]
    stream.close()
    assert inner.calls == ["write", "flush", "flush"]
