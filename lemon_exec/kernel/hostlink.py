"""The kernel's host link: one Unix stream socket to its host, carrying both directions.

A host that starts the kernel itself listens on a socket in its private runtime directory
and names it in the kernel's environment (``HOST_LINK_ENV``, never in the connection file).
The kernel connects at start. Kernel → host: a blocking copy of every IOPub message (app.py)
and the bridge's frames; host → kernel: bridge replies, read by a daemon thread of their own
and handed to the waiting helper at once. Compared with ZeroMQ sockets this path has no
IO thread on either side: a helper's round trip is three thread wake-ups instead of seven.

Messages are Jupyter wire messages in :mod:`linkwire` framing. Replies must carry a valid
signature under the session key and name the open cell's comm id, exactly as on the control
channel (which stays the path for hosts that do not set the link, e.g. kernels behind a
gateway). A host that stops reading makes senders block (the socket's buffer is the queue):
output is never dropped, and a flooding script slows to the host's pace.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Sequence
from typing import Any

from lemon_exec.kernel import cells, protocol
from lemon_exec.kernel.limits import MAX_MESSAGE_BYTES
from lemon_exec.kernel.linkwire import FrameReader, LinkFramingError, pack_head

log = logging.getLogger(__name__)

#: Bytes the kernel may have in flight to the host before a send waits (if the system
#: allows as much): room for a few stream chunks or one large text frame.
_SEND_BUFFER = 1 << 20

_MAIN = threading.main_thread()
_SIGINT = {signal.SIGINT}


class HostLink:
    """The kernel's end of the link; :meth:`send` is safe from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(cls, path: str) -> HostLink:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    def send(self, frames: Sequence[Any]) -> None:
        """Send one message whole; blocks while the host is behind. Raises OSError once the
        host is gone (or the link was closed)."""
        parts = [pack_head(frames), *frames]
        with self._lock:
            if self.closed:
                raise OSError("the host link is closed")
            if threading.current_thread() is _MAIN:
                # A message cut off halfway (KeyboardInterrupt inside sendmsg) would leave
                # the stream unreadable: SIGINT waits until the message is out.
                old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
                try:
                    _send_all(self._sock, parts)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)
            else:
                _send_all(self._sock, parts)

    def start_reader(self, session: Any) -> None:
        """Read host replies in a daemon thread and hand each to the open cell's bridge."""
        thread = threading.Thread(
            target=self._serve, args=(session,), name="lemon-bridge-replies", daemon=True
        )
        thread.start()

    def close(self) -> None:
        """Close the link; a send blocked on a host that stopped reading fails at once."""
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the reader and any blocked sender
        if self._lock.acquire(timeout=1.0):
            try:
                self._sock.close()
            finally:
                self._lock.release()

    def _serve(self, session: Any) -> None:
        reader = FrameReader(MAX_MESSAGE_BYTES)
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                return  # closed at exit
            if not data:
                return  # the host is gone
            reader.feed(data)
            try:
                for message in reader.messages():
                    if isinstance(message, list):
                        deliver_reply(session, message)
            except LinkFramingError:
                log.error("bridge replies: the host link is out of step; replies stop here")
                return
            except Exception:  # a bug here must not end the channel
                log.exception("error delivering a bridge reply")


def _send_all(sock: socket.socket, parts: list[Any]) -> None:
    views = [memoryview(part).cast("B") for part in parts]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if sent:
            views[0] = views[0][sent:]


def deliver_reply(session: Any, raw: list[Any]) -> None:
    """Verify one reply message and hand it to the open cell's bridge (else drop it)."""
    try:
        msg = protocol.unpack_signed(session, raw)
    except Exception:  # bad signature or malformed: dropped, like ipykernel does
        log.error("invalid lemon bridge reply", exc_info=True)
        return
    content = msg.get("content")
    bridge = cells.STATE.bridge
    if msg.get("msg_type") != protocol.REPLY_MSG_TYPE or not isinstance(content, dict):
        return
    if bridge is None or content.get("comm_id") != bridge.comm_id:
        return  # a reply for a cell that has ended
    bridge.deliver(content)
