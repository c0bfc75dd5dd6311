"""The host's end of a kernel's host link (kernel/hostlink.py): a Unix socket, both ways.

The host listens on a path in its private runtime directory before it starts the kernel,
accepts the kernel's one connection, then removes the path, so nothing else can connect
later. It reads from the event loop without ever blocking it: each readable event takes at
most ``_READ_PER_EVENT`` bytes, cuts them into messages (:mod:`linkwire`) and hands each to
the kernel handle, which checks the signature and routes it. Replies are written without
blocking; what the socket does not take at once waits in order for it to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemon_exec.kernel.limits import MAX_MESSAGE_BYTES
from lemon_exec.kernel.linkwire import FrameReader, LinkFramingError, pack_head

log = logging.getLogger(__name__)

#: Bytes read per readable event before the loop runs something else (the cells' deadline
#: watchdogs, other kernels): a flooding kernel cannot starve the loop.
_READ_PER_EVENT = 1 << 20
_RECV_BYTES = 1 << 18

OnMessage = Callable[[list[bytes]], None]
OnOversize = Callable[[int], None]
#: Called once when the link ends: None for the kernel closing it, else what was wrong.
OnEnd = Callable[[str | None], None]


class LinkEnd:
    """One kernel's link, from listening to closed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(str(path))
            self._listener.listen(1)
            self._listener.setblocking(False)
        except BaseException:
            self._listener.close()
            raise
        self._conn: socket.socket | None = None
        self._reader = FrameReader(MAX_MESSAGE_BYTES)
        self._outgoing = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    @property
    def connected(self) -> bool:
        return self._conn is not None and not self._closed

    async def serve(self, on_message: OnMessage, on_oversize: OnOversize, on_end: OnEnd) -> None:
        """Accept the kernel's connection, then deliver what it sends until the link ends."""
        assert self._listener is not None
        loop = self._loop = asyncio.get_running_loop()
        conn, _ = await loop.sock_accept(self._listener)
        self._stop_listening()
        if self._closed:
            conn.close()
            return
        conn.setblocking(False)
        self._conn = conn
        ended = loop.create_future()

        def end(problem: str | None) -> None:
            if not ended.done():
                with contextlib.suppress(ValueError, OSError):  # closed already: nothing to do
                    loop.remove_reader(conn.fileno())
                ended.set_result(problem)

        def readable() -> None:
            taken = 0
            try:
                while taken < _READ_PER_EVENT:
                    try:
                        data = conn.recv(_RECV_BYTES)
                    except (BlockingIOError, InterruptedError):
                        break
                    if not data:
                        end(None)
                        break
                    taken += len(data)
                    self._reader.feed(data)
                    for message in self._reader.messages():
                        if isinstance(message, int):
                            on_oversize(message)
                        else:
                            on_message(message)
            except LinkFramingError as exc:
                end(f"the kernel's link to the host is out of step ({exc})")
            except OSError as exc:
                end(f"the kernel's link to the host failed ({exc.strerror or exc})")

        loop.add_reader(conn.fileno(), readable)
        try:
            problem = await ended
        finally:
            end(None)
        on_end(problem)

    def send(self, frames: list[Any]) -> bool:
        """Queue one message for the kernel without blocking; False when not connected."""
        conn = self._conn
        if conn is None or self._closed:
            return False
        data = pack_head(frames) + b"".join(frames)
        if self._outgoing:
            self._outgoing += data
            return True
        try:
            sent = conn.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return True  # the kernel is gone; its end is reported by the reader
        if sent < len(data):
            self._outgoing += data[sent:]
            assert self._loop is not None
            self._loop.add_writer(conn.fileno(), self._drain)
        return True

    def _drain(self) -> None:
        conn = self._conn
        assert conn is not None and self._loop is not None
        try:
            sent = conn.send(self._outgoing)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            sent = len(self._outgoing)  # gone: nothing more can be delivered
        del self._outgoing[:sent]
        if not self._outgoing:
            self._loop.remove_writer(conn.fileno())

    def close(self) -> None:
        """Close the link and remove its path (idempotent; no await needed)."""
        self._closed = True
        self._stop_listening()
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._loop is not None and not self._loop.is_closed():
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(conn.fileno())
                    self._loop.remove_writer(conn.fileno())
            conn.close()

    def _stop_listening(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
