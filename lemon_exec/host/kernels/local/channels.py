"""The host's channels to one local kernel: requests out, and messages routed back by parent.

Requests go out on shell (execute, kernel_info) and bridge replies on the host link
(:mod:`lemon_exec.host.kernels.local.link_end`), else on control. Three readers take what comes
back: IOPub on the host link, replies on shell, and control (drained). Each message is routed to
the cell that sent the request (by parent ``msg_id``), so a person attached to the same kernel
with their own client never leaks into an agent's result.

No frame over :data:`MAX_MESSAGE_BYTES` is ever buffered (zmq's MAXMSGSIZE closes the connection
when one announces itself; a watcher reconnects the channel at once and tells the running
cells), and a multi-frame message whose total is over the limit is dropped before it is decoded.

A message that fails its signature check, or is not a Jupyter message at all, is a protocol
fault: the kernel is no longer trusted. The running cells hear of it at once; a fault while no
cell runs is remembered in :attr:`KernelChannels.fault`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio

from lemon_exec.host.kernels.backend import MessageSink, drop_note, execute_request_content
from lemon_exec.host.kernels.local.link_end import LinkEnd
from lemon_exec.host.kernels.local.sockets import KernelSockets
from lemon_exec.wire import jupyter_messages, protocol
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES
from lemon_exec.wire.zmq_frames import NOBLOCK, recv_frames

log = logging.getLogger(__name__)

#: Messages a channel reader takes in a row before it lets the event loop run.
_READ_BURST = 32

#: After a channel's connection drops, how long to wait before asking whether the kernel is
#: still alive (a dying kernel's sockets close a moment before its process is reaped).
_DISCONNECT_SETTLE_S = 0.05


class KernelChannels:
    """The message side of a :class:`~lemon_exec.host.kernels.local.kernel.ManagedKernel`.

    ``is_alive`` tells whether the kernel process still runs (asked when a connection drops).
    """

    def __init__(
        self,
        sockets: KernelSockets,
        link: LinkEnd,
        *,
        kernel_id: str,
        is_alive: Callable[[], Awaitable[bool]],
    ) -> None:
        self._sockets = sockets
        #: The host link: IOPub in, bridge replies out.
        self._link = link
        self._kernel_id = kernel_id
        self._is_alive = is_alive
        self._sinks: dict[str, MessageSink] = {}
        self._readers: list[asyncio.Task[None]] = []
        self._monitors: list[zmq.asyncio.Socket] = []
        loop = asyncio.get_running_loop()
        self._welcome: asyncio.Future[None] = loop.create_future()
        self._kernel_info: asyncio.Future[dict[str, Any]] = loop.create_future()
        #: Closed with the kernel: nothing is sent, and a dropped connection means nothing.
        self.closed = False
        #: Told to stop (SIGTERM/SIGKILL sent): its sockets closing is its exit, not a drop.
        self.stopping = False
        #: The kernel's link to the host has ended (the reader saw it close).
        self.link_ended = False
        #: Why the kernel is no longer trusted (the first protocol fault), or None.
        self.fault: str | None = None
        #: How many messages failed their signature check or were malformed.
        self.invalid_messages = 0

    def start(self) -> None:
        """Start reading: the host link (IOPub), shell and control, and their watchers."""
        session = self._sockets.session
        self._readers.append(
            asyncio.create_task(
                self._link.serve(
                    lambda frames: self._take("IOPub", frames, session, self._route_iopub),
                    lambda size: self._dropped("IOPub", drop_note(size)),
                    self._link_ended,
                )
            )
        )
        channels = (
            ("shell", self._sockets.shell, self._route_reply),
            ("control", self._sockets.control, _ignore),
        )
        for name, socket, route in channels:
            self._readers.append(asyncio.create_task(self._read(name, socket, route)))
            monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self._monitors.append(monitor)
            self._readers.append(asyncio.create_task(self._watch(name, socket, monitor)))

    def ready(self) -> asyncio.Future[Any]:
        """Ask for kernel_info; done once it answered AND IOPub is subscribed.

        ipykernel >= 7.2 says the latter with iopub_welcome; older kernels are ready once any
        IOPub message arrives.
        """
        self.send_shell("kernel_info_request", {})
        return asyncio.gather(self._kernel_info, self._welcome)

    async def close(self) -> None:
        """Stop the readers and close every socket (the kernel is being killed)."""
        self.closed = True
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._close_monitors()
        self._sockets.close()
        self._link.close()

    def close_sync(self) -> None:
        """Close the link and the watchers without awaiting (exit-time cleanup)."""
        self.closed = True
        self._link.close()
        self._close_monitors()

    def execute(self, code: str, metadata: dict[str, Any], sink: MessageSink) -> str:
        """Send an execute_request whose outputs go to ``sink``; returns its msg_id."""
        msg = self._sockets.session.msg(
            "execute_request", execute_request_content(code), metadata=metadata
        )
        msg_id: str = msg["header"]["msg_id"]
        self._sinks[msg_id] = sink
        self._sockets.send(self._sockets.shell, msg)
        return msg_id

    def release(self, msg_id: str) -> None:
        """Stop routing messages of ``msg_id``; later ones are dropped."""
        self._sinks.pop(msg_id, None)

    def send_shell(self, msg_type: str, content: dict[str, Any]) -> str:
        msg = self._sockets.session.msg(msg_type, content)
        self._sockets.send(self._sockets.shell, msg)
        msg_id: str = msg["header"]["msg_id"]
        return msg_id

    def send_bridge_reply(self, content: dict[str, Any]) -> None:
        """Send a bridge reply on the host link, else on control (docs/comm-protocol.md)."""
        if self.closed:
            return
        session = self._sockets.session
        if self._link.connected:
            packed = json.dumps(content).encode("ascii")  # ASCII: any str the tool returned
            self._link.send(jupyter_messages.pack_signed(session, protocol.REPLY_MSG_TYPE, packed))
            return
        self._sockets.send(self._sockets.control, session.msg(protocol.REPLY_MSG_TYPE, content))

    def _link_ended(self, problem: str | None) -> None:
        """The kernel's link closed: its exit, unless the kernel lives on without it."""
        self.link_ended = True
        if self.closed or self.stopping:
            return
        if problem is not None:
            self._faulted("IOPub", problem)
            return
        task = asyncio.ensure_future(self._check_link_closed())
        self._readers.append(task)

    async def _check_link_closed(self) -> None:
        await asyncio.sleep(_DISCONNECT_SETTLE_S)  # a dying kernel closes it just before exit
        if not self.closed and not self.stopping and await self._is_alive():
            self._faulted("IOPub", "the kernel closed its link to the host")

    async def _read(
        self, name: str, socket: zmq.asyncio.Socket, route: Callable[[dict[str, Any]], None]
    ) -> None:
        # Reads the channel's socket directly and decodes with jupyter_messages.unpack_signed: every
        # stream chunk and bridge frame passes here, and Session.deserialize's date parsing
        # was a measurable part of a helper's round trip.
        # Messages are taken with non-blocking receives on a plain view of the socket while
        # its descriptor is readable: no future, timer or reader registration per message
        # (pyzmq's awaitable recv makes each), which was a measurable part of a helper's
        # round trip and of text() throughput.
        session = self._sockets.session
        plain: zmq.Socket[bytes] = zmq.Socket.shadow(socket.underlying)
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        fd = plain.FD
        loop.add_reader(fd, readable.set)
        try:
            while True:
                for _ in range(_READ_BURST):
                    try:
                        # copy=False: the size is checked before any byte is copied or decoded.
                        frames = recv_frames(plain, NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    self._take(name, frames, session, route)
                else:
                    # A burst: let the loop run (the cells' deadline watchdog), then go on.
                    await asyncio.sleep(0)
                    continue
                readable.clear()
                # zmq's descriptor is edge-triggered: look again before waiting on it.
                if int(plain.get(zmq.EVENTS)) & zmq.POLLIN:
                    continue
                await readable.wait()
        finally:
            loop.remove_reader(fd)

    def _take(
        self,
        name: str,
        frames: list[Any],
        session: Any,
        route: Callable[[dict[str, Any]], None],
    ) -> None:
        """Check, verify and route one message read on channel ``name``."""
        size = sum(len(frame) for frame in frames)
        if size > MAX_MESSAGE_BYTES:
            del frames
            self._dropped(name, drop_note(size))
            return
        try:
            msg = jupyter_messages.unpack_signed(session, frames)
        except Exception as exc:  # badly signed or malformed: a protocol fault
            self._faulted(name, _fault_reason(exc))
            return
        try:
            route(msg)
        except Exception:
            log.exception("error routing a kernel message")

    async def _watch(
        self, name: str, socket: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        """Reconnect ``socket`` whenever its connection drops, and report why.

        On ipc a live kernel never closes its end, so a drop means zmq refused a frame over
        MAXMSGSIZE (a protocol error, after which zmq does not reconnect by itself).
        Messages the kernel sent until the new connection was up are lost, hence the note.
        """
        while True:
            event = await monitor.recv_multipart()
            endpoint = event[1].decode() if len(event) > 1 else ""
            if self.closed or self.stopping or not endpoint:
                continue
            with contextlib.suppress(zmq.ZMQError):
                socket.disconnect(endpoint)
            with contextlib.suppress(zmq.ZMQError):
                socket.connect(endpoint)
            await asyncio.sleep(_DISCONNECT_SETTLE_S)
            if await self._is_alive():
                log.warning("kernel %s: %s connection dropped; reconnected", self._kernel_id, name)
                self._dropped(name, drop_note(None, lost_around=True))

    def _dropped(self, channel: str, note: str) -> None:
        for sink in list(self._sinks.values()):
            try:
                sink.on_dropped(channel, note)
            except Exception:
                log.exception("error reporting a dropped kernel message")

    def _faulted(self, channel: str, reason: str) -> None:
        """Count an invalid message; the running cells end (the kernel is not trusted)."""
        self.invalid_messages += 1
        if self.fault is None:
            self.fault = reason
            log.warning("kernel %s: protocol fault on %s: %s", self._kernel_id, channel, reason)
        for sink in list(self._sinks.values()):
            try:
                sink.on_protocol_fault(channel, reason)
            except Exception:
                log.exception("error reporting a protocol fault")

    def _close_monitors(self) -> None:
        for socket in (self._sockets.shell, self._sockets.control):
            if not socket.closed:
                with contextlib.suppress(zmq.ZMQError):
                    socket.disable_monitor()
        for monitor in self._monitors:
            monitor.close(linger=0)
        self._monitors.clear()

    def _route_iopub(self, msg: dict[str, Any]) -> None:
        msg_type = msg.get("msg_type")
        if msg_type == "iopub_welcome" or (msg_type == "status" and not self._welcome.done()):
            if not self._welcome.done():
                self._welcome.set_result(None)
            return
        sink = self._sinks.get(msg.get("parent_header", {}).get("msg_id", ""))
        if sink is not None:
            sink.on_iopub(msg)

    def _route_reply(self, msg: dict[str, Any]) -> None:
        if msg.get("msg_type") == "kernel_info_reply":
            if not self._kernel_info.done():
                self._kernel_info.set_result(msg["content"])
            return
        sink = self._sinks.get(msg.get("parent_header", {}).get("msg_id", ""))
        if sink is not None:
            sink.on_reply(msg)


def _fault_reason(exc: Exception) -> str:
    """What was wrong with a message :func:`jupyter_messages.unpack_signed` refused."""
    if "signature" in str(exc):  # unpack_signed's "invalid message signature"
        return "a message from the kernel failed its signature check"
    return "a message from the kernel was malformed"


def _ignore(_msg: dict[str, Any]) -> None:
    """Control replies (e.g. to interrupts) need no routing, but must be drained."""
