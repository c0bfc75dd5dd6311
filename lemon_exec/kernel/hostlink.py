"""The kernel's host link: one Unix stream socket to its host, carrying both directions.

A host that starts the kernel itself listens on a socket in its private runtime directory
and names it in the kernel's environment (``HOST_LINK_ENV``, never in the connection file).
The kernel connects at start. Kernel → host: a blocking copy of every IOPub message (app.py)
and the bridge's frames; host → kernel: bridge replies, read by the threads that wait for
them (:meth:`HostLink.wait`). Compared with ZeroMQ sockets this path has no IO thread on
either side, and a helper that is answered promptly finds its reply without sleeping: its
round trip is one thread wake-up (the host's loop) instead of seven.

Messages are Jupyter wire messages in :mod:`~lemon_exec.wire.link_framing` framing. Replies
must carry a valid signature under the session key and name the open cell's comm id, exactly
as on the control channel (which stays the path for hosts that do not set the link, e.g.
kernels behind a gateway). A host that stops reading makes senders block (the socket's
buffer is the queue): output is never dropped, and a flooding script slows to the host's
pace.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import signal
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from lemon_exec.kernel import cells
from lemon_exec.wire import jupyter_messages, protocol
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES
from lemon_exec.wire.link_framing import FrameReader, LinkFramingError, pack_head

log = logging.getLogger(__name__)

#: How long a waiting thread keeps polling the link for its reply before it sleeps. Most
#: helper calls are answered within it; waking a sleeping thread costs far more on a VM.
SPIN_S = 0.001
_RECV_BYTES = 1 << 16

#: Bytes the kernel may have in flight to the host before a send waits (if the system
#: allows as much): room for a few stream chunks or one large text frame.
_SEND_BUFFER = 1 << 20

_SIGINT = {signal.SIGINT}


class HostLink:
    """The kernel's end of the link; :meth:`send` is safe from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()  # senders take turns: a message goes out whole
        self.closed = False
        #: The host closed the link (or it broke): no reply will come any more.
        self.ended = False
        self._session: Any = None
        self._read_lock = threading.Lock()  # held by the one waiter reading the link
        self._turns = threading.Condition()  # the other waiters wait here
        self._frames = FrameReader(MAX_MESSAGE_BYTES)
        #: How long the last reply this link's reader waited for took (see _read_until).
        self._last_wait = 0.0
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN)

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
            if threading.current_thread() is threading.main_thread():
                # A message cut off halfway (KeyboardInterrupt inside sendmsg) would leave
                # the stream unreadable: SIGINT waits until the message is out.
                old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGINT)
                try:
                    _send_all(self._sock, parts)
                finally:
                    signal.pthread_sigmask(signal.SIG_SETMASK, old)
            else:
                _send_all(self._sock, parts)

    def close(self) -> None:
        """Close the link; a send blocked on a host that stopped reading fails at once."""
        self.closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes any waiter and any blocked sender
        if self._lock.acquire(timeout=1.0):
            try:
                self._sock.close()
            finally:
                self._lock.release()

    def serve_replies(self, session: Any) -> None:
        """Deliver host replies, checked with ``session``, to the threads that wait for them."""
        self._session = session

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``event``; returns whether it is set.

        A waiting thread reads the link itself (one at a time: the others wait for it to
        deliver their replies, or to hand over reading when its own reply has come). The
        reader polls for :data:`SPIN_S` before it sleeps (unless the last reply took
        longer): a reply that comes within that finds it awake, so neither the host's send
        nor the reply pays a thread's wake-up.
        """
        deadline = time.monotonic() + timeout
        while not event.is_set():
            if self._session is None or self.ended:
                return event.wait(max(0.0, deadline - time.monotonic()))
            if self._read_lock.acquire(blocking=False):
                try:
                    self._read_until(event, deadline)
                finally:
                    self._read_lock.release()
                    with self._turns:
                        self._turns.notify_all()  # another waiter takes over reading
                return event.is_set()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with self._turns:
                if not event.is_set() and self._read_lock.locked():
                    self._turns.wait(remaining)
        return True

    def _read_until(self, event: threading.Event, deadline: float) -> None:
        started = time.monotonic()
        # Polling pays off only for replies that come within SPIN_S; after a slow one (an
        # upstream MCP call, a webfetch) the next is likely slow too, and a polling thread
        # would only take a core from the host and the tool.
        spin_until = started + (SPIN_S if self._last_wait <= SPIN_S else 0.0)
        try:
            self._poll_link(event, deadline, spin_until)
        finally:
            if event.is_set():
                self._last_wait = time.monotonic() - started

    def _poll_link(self, event: threading.Event, deadline: float, spin_until: float) -> None:
        while not event.is_set():
            try:
                data = self._sock.recv(_RECV_BYTES, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                now = time.monotonic()
                if now >= deadline:
                    return
                if now >= spin_until:  # sleep until something arrives (or the slice ends)
                    self._poller.poll(max(1, math.ceil((deadline - now) * 1000)))
                continue
            except OSError:
                data = b""
            if not data:
                self.ended = True  # the host is gone: nothing more will come
                return
            self._frames.feed(data)
            try:
                for message in self._frames.messages():
                    if isinstance(message, list):
                        deliver_reply(self._session, message)
            except LinkFramingError:
                log.error("bridge replies: the host link is out of step; replies stop here")
                self.ended = True
                return
            with self._turns:
                self._turns.notify_all()  # a waiter whose reply came checks its event


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
        msg = jupyter_messages.unpack_signed(session, raw)
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
