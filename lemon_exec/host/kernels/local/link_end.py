"""The host's end of a kernel's host link (kernel/hostlink.py): a Unix socket, both ways.

The host listens on a path in its private runtime directory before it starts the kernel,
accepts the kernel's one connection, then removes the path, so nothing else can connect
later. It reads from the event loop without waiting on the kernel: each readable event
takes at most ``_READ_PER_EVENT`` bytes, cuts them into messages
(:mod:`~lemon_exec.wire.link_framing`) and hands each to the kernel handle, which checks the
signature and routes it. Replies are written without blocking; what the socket does not
take at once waits in order for it to drain.

The one exception is short and bounded: after a callback that answered a call, the reader
polls the link for up to :data:`SPIN_S` before it returns to the loop, as long as the
kernel's last frame came within :data:`_SPIN_GAP_S` of a reply and no other kernel's link
was read in between. A script calling helpers in a loop sends its next frame a few hundred
microseconds after each answer, and waking the loop's thread from its sleep costs about as
much again on a VM that halts idle vCPUs. A frame that does not come within SPIN_S ends the
polling until one comes that soon again; with several kernels busy, nobody polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lemon_exec.wire.limits import MAX_MESSAGE_BYTES
from lemon_exec.wire.link_framing import FrameReader, LinkFramingError, pack_head

log = logging.getLogger(__name__)

#: Bytes read per readable event before the loop runs something else (the cells' deadline
#: watchdogs, other kernels): a flooding kernel cannot starve the loop.
_READ_PER_EVENT = 1 << 20
_RECV_BYTES = 1 << 18
#: How long the reader polls for the kernel's next frame after answering one (see above),
#: and how soon after the last answer the last frame must have come for it to poll.
SPIN_S = 0.0005
_SPIN_GAP_S = 0.001

#: Mode of the listening socket's file (a staging object: owner only).
SOCKET_MODE = 0o600

OnMessage = Callable[[list[bytes]], None]
OnOversize = Callable[[int], None]
#: Called once when the link ends: None for the kernel closing it, else what was wrong.
OnEnd = Callable[[str | None], None]


class LinkEnd:
    """One kernel's link, from listening to closed."""

    #: The id of the link whose reader ran last, on any loop (see readable's polling rule);
    #: an id, so a closed link is not kept alive by it.
    _last_reader = 0

    def __init__(self, path: Path) -> None:
        self.path = path
        self._listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Linux gives the socket file the socket inode's mode less the umask: set it
            # first, so the file is 0600 from its creation (the host's umask is not ours).
            os.fchmod(self._listener.fileno(), SOCKET_MODE)
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
        self._sent = 0  # messages sent: a callback that sent one answered something
        self._sent_at = 0.0  # when the last one was sent (perf_counter)
        #: Polling pays off only when the last reply's next frame came this soon: 1 ms, or
        #: SPIN_S once a poll came up empty (until one finds its frame).
        self._gap_limit = _SPIN_GAP_S
        self._poller = select.poll()  # the connection's, once accepted

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
        self._poller.register(conn.fileno(), select.POLLIN)
        ended = loop.create_future()

        def end(problem: str | None) -> None:
            if not ended.done():
                with contextlib.suppress(ValueError, OSError):  # closed already: nothing to do
                    loop.remove_reader(conn.fileno())
                ended.set_result(problem)

        def readable() -> None:
            taken = 0
            gap = math.inf  # from the last reply to this frame
            # Another kernel's link read since this one last did: the loop has other
            # kernels to serve, and polling would hold them up (and take their core).
            shared = LinkEnd._last_reader != id(self)
            LinkEnd._last_reader = id(self)
            try:
                while taken < _READ_PER_EVENT:
                    try:
                        data = conn.recv(_RECV_BYTES)
                    except (BlockingIOError, InterruptedError):
                        break
                    if not data:
                        end(None)
                        break
                    if taken == 0 and self._sent_at:
                        gap = time.perf_counter() - self._sent_at
                    taken += len(data)
                    self._reader.feed(data)
                    sent = self._sent
                    for message in self._reader.messages():
                        if isinstance(message, int):
                            on_oversize(message)
                        else:
                            on_message(message)
                    if len(data) < _RECV_BYTES:
                        # Drained: the next event says when more comes. If a reply just went
                        # out, wait for that frame here (at most SPIN_S), not asleep in the
                        # loop; it is read in that next event, after the loop's other work.
                        if self._sent != sent and not shared and gap <= self._gap_limit:
                            self._await_next()
                        break
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

    def _await_next(self) -> None:
        """Poll up to SPIN_S for the kernel's next frame after a reply (see the module doc)."""
        deadline = time.perf_counter() + SPIN_S
        while time.perf_counter() < deadline:
            if self._poller.poll(0):
                self._gap_limit = _SPIN_GAP_S
                return
        # It did not come: no polling until a frame comes within SPIN_S of an answer again
        # (a script that pauses ~1 ms between calls would otherwise be polled for in vain).
        self._gap_limit = SPIN_S

    def send(self, frames: list[Any]) -> bool:
        """Queue one message for the kernel without blocking; False when not connected."""
        conn = self._conn
        if conn is None or self._closed:
            return False
        data = pack_head(frames) + b"".join(frames)
        self._sent += 1
        self._sent_at = time.perf_counter()
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
