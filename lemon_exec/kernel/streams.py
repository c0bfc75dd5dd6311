"""stdout/stderr for script cells: merged in order, flushed in bounded chunks.

ipykernel's OutStream buffers for 0.2 s without a size bound, so a tight print loop would
build one enormous stream message (memory on both sides). During a script both sys.stdout
and sys.stderr are one ChunkedStream: output keeps its order (the spec merges the two), and
every 64 KiB it flushes synchronously, which also slows a flooding script to the pace at
which the host drains IOPub (its link blocks rather than drops; see hostlink.py).
"""

from __future__ import annotations

import codecs
import contextlib
import fcntl
import io
import os
import select
import struct
import sys
import termios
import threading
from typing import Any

from ipykernel.iostream import OutStream

from lemon_exec.kernel import cells
from lemon_exec.wire.text_budget import normalize_text

#: Fixed by the spec: output travels in chunks of at most 64 KiB.
STREAM_CHUNK_CHARS = 64 * 1024


class ChunkedStream(io.TextIOBase):
    def __init__(self, inner: Any, chunk: int = STREAM_CHUNK_CHARS) -> None:
        self._inner = inner
        self._chunk = chunk
        self._pending = 0
        self._buffer = _BytesToText(self)

    @property
    def buffer(self) -> io.RawIOBase:
        """``sys.stdout.buffer`` as scripts know it: bytes in, decoded as UTF-8."""
        return self._buffer

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if cells.late_writer():  # a thread an earlier cell left: not this cell's output
            cells.count_late(_utf8_len(text))
            return len(text)
        drain = getattr(self._inner, "drain_pipe", None)
        if drain is not None:
            drain()
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
        # Skips the IO-thread round trip when nothing is buffered (helpers flush per frame).
        getattr(self._inner, "flush_pending", self._inner.flush)()

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

    def __del__(self) -> None:
        # No flush when collected (io's finalizer would close, and so flush). It forms a
        # cycle with its ``buffer``, so the collector may free it in the middle of a later
        # cell's write to the OutStream, which holds the stream's lock: a flush from there
        # waits for the IO thread, which waits for that lock (a deadlock). The kernel
        # flushes it when the cell ends; an explicit close() still flushes.
        pass


class BoundedOutStream(OutStream):
    """ipykernel's OutStream with two changes for scripts.

    1. Flushed whenever 64 KiB are pending. It also receives what child processes write to
       the kernel's file descriptors, which ChunkedStream never sees; without the bound a
       child flooding its stdout would build one huge message within the 0.2 s interval.
    2. Bytes from the file-descriptor pipe move into the stream under a lock, by the pipe
       watcher or by :meth:`drain_pipe`. A Python-level write drains the pipe first, so
       output of a child process that has finished comes before what Python prints next —
       the order a terminal would show.
    3. Each script cell gets its own pipe on file descriptor 1 (and 2) (:meth:`begin_cell`,
       :meth:`end_cell`). A child process inherits the pipe of the cell that started it, so
       what a child left running by an ended cell writes arrives on that cell's old pipe:
       read, counted as late output and dropped, never shown in a later cell. Likewise a
       Python write from a thread of an ended cell (:func:`cells.late_writer`).
    4. In a forked child (``multiprocessing`` with fork, ``os.fork``) a write goes straight
       to the captured file descriptor, whose pipe the parent's watcher forwards. The kernel
       has no IOPub "pipe" socket for children (see app.py), and a child must not touch the
       parent's zmq sockets.
    """

    # ipykernel leaves OutStream's methods unannotated: calls into them are untyped calls.
    #: Characters written since a flush began (counted once the text is in the buffer).
    _unflushed = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._pipe_lock = threading.Lock()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        #: The running script cell's pipe (read end) while one runs, else None.
        self._cell_fid: int | None = None
        #: The write end that fd 1 had before the cell's pipe replaced it.
        self._saved_fd1: int | None = None
        #: Pipes of ended cells that a leftover child may still write to (read ends).
        self._retired: set[int] = set()
        # Wakes the watcher when the set of pipes it reads changes. Made before OutStream's
        # __init__, which starts the watcher.
        self._wake_r, self._wake_w = os.pipe()
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    # int | None is OutStream.write's own type (None: a child's flush is already pending).
    def write(self, string: str) -> int | None:  # type: ignore[override]
        if not self._is_master_process():  # type: ignore[no-untyped-call]
            return self._write_from_child(string)
        if isinstance(string, str) and cells.late_writer():  # not this cell's output
            cells.count_late(_utf8_len(string))
            return len(string)
        return self._emit(string)

    def _emit(self, string: str) -> int | None:
        # A lone surrogate would make the message unencodable and lose the whole chunk.
        written = super().write(normalize_text(string) if isinstance(string, str) else string)
        self._unflushed += len(string)
        if self._unflushed >= STREAM_CHUNK_CHARS:
            self.flush()  # from a non-IO thread this waits for the send: backpressure
        return written

    def flush(self) -> None:
        # In a forked child the buffers hold the parent's unsent text, which is not ours
        # to send (the parent does), and writes went to the file descriptor already.
        if not self._is_master_process():  # type: ignore[no-untyped-call]
            self._unflushed = 0
            return
        # Nothing written since the last flush (ipykernel flushes both streams after every
        # cell): no round trip to the IO thread, which costs two thread wake-ups. A flush
        # under way elsewhere was queued to the IO thread before anything that follows.
        fid = self._watched_pipe()
        if not self._unflushed and (fid is None or _pending_bytes(fid) == 0):
            return
        self._unflushed = 0
        super().flush()  # type: ignore[no-untyped-call]

    def flush_pending(self) -> None:
        """Flush what was written, and what child processes wrote to the pipe so far."""
        self.drain_pipe()
        self.flush()  # returns at once when nothing was written since the last flush

    def drain_pipe(self) -> None:
        """Move whatever child processes wrote so far into the stream, before a new write."""
        fid = self._watched_pipe()
        if fid is None:
            return
        with self._pipe_lock:
            while _pending_bytes(fid) > 0:
                if not self._forward(fid):
                    return

    def _watched_pipe(self) -> int | None:
        """The pipe whose bytes are output now: the cell's, else the captured descriptors'."""
        fid: int | None = getattr(self, "_fid", None)
        # A forked child inherits the pipe's read end: draining there would steal the bytes.
        if fid is None or not self._should_watch or not self._is_master_process():  # type: ignore[no-untyped-call]
            return None
        return fid if self._cell_fid is None else self._cell_fid

    def begin_cell(self) -> None:
        """Give file descriptor 1 a pipe of this script cell's own (see the class doc)."""
        if self._watched_pipe() is None or self._cell_fid is not None:
            return
        fd = self._original_stdstream_fd
        read_end, write_end = os.pipe()
        try:
            self._saved_fd1 = os.dup(fd)
            os.dup2(write_end, fd)
        except OSError:
            os.close(read_end)
            return
        finally:
            os.close(write_end)
        self.drain_pipe()  # what came before the cell, in order, from the old pipe
        with self._pipe_lock:
            self._cell_fid = read_end
        self._wake()

    def end_cell(self) -> None:
        """Put back the kernel's pipe on fd 1; the cell's pipe is retired (call after the
        cell's last output was drained)."""
        saved, self._saved_fd1 = self._saved_fd1, None
        if saved is None:
            return
        with contextlib.suppress(OSError):
            os.dup2(saved, self._original_stdstream_fd)
        os.close(saved)
        with self._pipe_lock:
            if self._cell_fid is not None:
                self._retired.add(self._cell_fid)
            self._cell_fid = None
        self._wake()

    def close(self) -> None:
        super().close()  # type: ignore[no-untyped-call]  # stops and joins the watcher
        if self._wake_w < 0 or not self._is_master_process():  # type: ignore[no-untyped-call]
            return  # closed already (a number closed twice may be another file's by then)
        for fd in (self._wake_r, self._wake_w, *self._retired):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._retired.clear()
        self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"w")

    def _write_from_child(self, string: str) -> int:
        if not isinstance(string, str):
            raise TypeError(f"write() argument must be str, not {type(string).__name__}")
        fd = getattr(self, "_original_stdstream_fd", None)
        if fd is None:  # no capture set up: nowhere the parent would read it from
            return len(string)
        data = normalize_text(string).encode("utf-8", "replace")
        while data:
            data = data[os.write(fd, data) :]
        return len(string)

    def _watch_pipe_fd(self) -> None:
        # Replaces ipykernel's watcher: same job, but bytes move under the pipe lock, UTF-8 is
        # decoded incrementally (a character split across reads stays whole), and child
        # output is not echoed to the kernel's own stderr log.
        kernel_fid = getattr(self, "_fid", None)
        if kernel_fid is None:
            return
        try:
            while self._should_watch:
                with self._pipe_lock:
                    live = kernel_fid if self._cell_fid is None else self._cell_fid
                    watched = [live, *self._retired, self._wake_r]
                ready = select.select(watched, [], [])[0]
                if self._wake_r in ready:
                    os.read(self._wake_r, 4096)
                with self._pipe_lock:
                    for fid in ready:
                        if fid in self._retired:
                            self._discard_late(fid)
                            continue
                        if fid != (kernel_fid if self._cell_fid is None else self._cell_fid):
                            continue  # the wake pipe, or a pipe swapped meanwhile
                        # A writer may have drained the pipe since select() said readable:
                        # a blocking read would then hold the lock until the next byte came,
                        # and the cell's end (which drains the pipe too) would wait for it
                        # forever. Readable with nothing pending, under the lock, is the end
                        # of file.
                        if _pending_bytes(fid) == 0 and not select.select([fid], [], [], 0)[0]:
                            continue
                        if not self._forward(fid) and fid == kernel_fid:
                            return
        except Exception:
            self._exc = sys.exc_info()

    def _discard_late(self, fid: int) -> None:
        """Read what a leftover child wrote to an ended cell's pipe: counted, dropped."""
        data = os.read(fid, max(1, min(_pending_bytes(fid), STREAM_CHUNK_CHARS)))
        if data:
            cells.count_late(len(data))
            return
        self._retired.discard(fid)  # end of file: every writer is gone
        os.close(fid)

    def _forward(self, fid: int) -> bool:
        """Read what is available (caller holds the lock); False at end of file."""
        data = os.read(fid, max(1, min(_pending_bytes(fid), STREAM_CHUNK_CHARS)))
        if not data:
            return False
        text = self._decoder.decode(data)
        if text and self._should_watch:
            self._emit(text)  # never dropped as late: the writer was whoever drains
        return True


class _BytesToText(io.RawIOBase):
    """A binary writer that decodes UTF-8 (invalid bytes replaced) into a text stream."""

    def __init__(self, text: io.TextIOBase) -> None:
        self._text = text
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._text.write(self._decoder.decode(view.tobytes()))
        return len(view)

    def flush(self) -> None:
        self._text.flush()

    def __del__(self) -> None:
        pass  # no flush when collected: see ChunkedStream.__del__


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


def _pending_bytes(fd: int) -> int:
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return 0
