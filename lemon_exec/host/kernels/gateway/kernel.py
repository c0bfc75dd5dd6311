"""GatewayKernel: one kernel behind Jupyter Enterprise Gateway and the host's websocket to it.

The remote twin of :class:`lemon_exec.host.kernels.local.kernel.ManagedKernel` (a
:class:`~lemon_exec.host.kernels.backend.KernelHandle`): one reader task routes the websocket's
IOPub and shell messages to the cell that sent the request, by parent ``msg_id``; bridge
replies go out on the control channel (``channel: "control"``). The kernel gets no private
IOPub channel (the host cannot reach the kernel's sockets), so its frames travel on the
ordinary IOPub as ``comm_msg``, through the gateway.

Signals become REST calls: SIGINT interrupts, anything else shuts the kernel down. The
kernel's process is out of reach, so liveness is the websocket's: it counts as dead once the
websocket closes or the gateway reports the kernel restarting or dead (its restarter
noticed the process end). A running cell then ends as ``crashed`` (the exit status is not
known here, so the headline says -1) and the kernel's state is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import signal
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from tornado.websocket import WebSocketClientConnection, WebSocketClosedError

from lemon_exec.errors import KernelStartError
from lemon_exec.host.disk.index import KernelStatus
from lemon_exec.host.kernels.backend import MessageSink, drop_note, execute_request_content
from lemon_exec.host.kernels.gateway import client
from lemon_exec.host.kernels.gateway.client import Gateway
from lemon_exec.host.kernels.resource_limits import KernelCgroup
from lemon_exec.wire import protocol
from lemon_exec.wire.limits import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

#: How long an interrupt may take: the timeout's report waits for it (the kernel is
#: shut down afterwards either way).
INTERRUPT_TIMEOUT_S = 3.0
#: How long a shutdown request may take (the gateway asks the kernel to exit, waits its
#: shutdown_wait_time, then kills it; a pod may take longer to go).
REST_TIMEOUT_S = 30.0
#: The exit-time (blocking) shutdown request waits at most this long per kernel.
SYNC_DELETE_TIMEOUT_S = 2.0
#: Statuses only the gateway sends (its restarter saw the kernel process end).
_DEAD_STATES = ("restarting", "dead")
#: The websocket's own note: not an IOPub or shell gap (see cell._CellSink.on_dropped).
_LINK = "gateway"


class GatewayKernel:
    """A kernel the gateway runs, driven over its websocket. Create with :meth:`open`."""

    def __init__(
        self, gateway: Gateway, kernel_id: str, conn: WebSocketClientConnection, session: str
    ) -> None:
        self.kernel_id = kernel_id
        self.started_at = time.monotonic()
        self.status = KernelStatus(kernel_id, "per_call", "starting", "")
        self.fault: str | None = None
        self.invalid_messages = 0
        self.interrupted_at: float | None = None
        self.cgroup: KernelCgroup | None = None  # limits are the cluster's (docs/scale-out.md)
        self._gateway = gateway
        self._conn = conn
        self._socket = _tcp_socket(conn)
        self._session = session  # the websocket's session_id, also in every header
        self._sinks: dict[str, MessageSink] = {}
        #: Why the kernel is gone (the websocket closed, the gateway said so), or None.
        self.lost: str | None = None
        self._disposed = False
        loop = asyncio.get_running_loop()
        self._info: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._iopub_seen: asyncio.Future[None] = loop.create_future()
        self._reader = loop.create_task(self._read())

    @classmethod
    async def open(cls, gateway: Gateway, kernel_id: str, timeout: float) -> GatewayKernel:
        """Connect to a started kernel and wait until it answers on shell and IOPub.

        Raises ``KernelStartError`` (and closes the websocket) when the kernel is not a
        lemon-python kernel or the connection fails; ``TimeoutError`` when it is not ready.
        """
        session = secrets.token_hex(16)
        conn = await client.connect_channels(gateway, kernel_id, session, timeout)
        try:
            kernel = cls(gateway, kernel_id, conn, session)
        except BaseException:
            conn.close()
            raise
        try:
            await asyncio.wait_for(kernel._ready(), timeout)
        except BaseException:
            kernel._close()
            raise
        return kernel

    async def _ready(self) -> None:
        # kernel_info answered on shell, and an IOPub message (its busy/idle status) arrived:
        # both directions work and IOPub is subscribed.
        self._send("shell", "kernel_info_request", {})
        info = await self._info
        await self._iopub_seen
        if "lemon_protocol" not in info:
            name = info.get("implementation") or "unknown"
            raise KernelStartError(
                f"execute_code: the gateway's kernel is not a lemon-python kernel (it is "
                f"{name!r}); set gateway_kernel_name to the lemon-python kernelspec"
            )

    # -- process (over REST) -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return None  # the process runs where the gateway put it

    @property
    def disposed(self) -> bool:
        return self._disposed

    @property
    def link_ended(self) -> bool:
        return False  # a gateway's kernel has no host link

    async def is_alive(self) -> bool:
        return not self._disposed and self.lost is None

    async def exit_status(self) -> int | None:
        return None  # not reported by the gateway

    async def signal_group(self, signum: int) -> None:
        """SIGINT: the gateway interrupts the kernel (its process group); else shut it down."""
        if signum == signal.SIGINT:
            if not self._disposed and not await client.interrupt_kernel(
                self._gateway, self.kernel_id, INTERRUPT_TIMEOUT_S
            ):
                log.warning("kernel %s: the gateway did not confirm an interrupt", self.kernel_id)
            return
        await self.kill()

    async def kill(self) -> None:
        """Close the websocket and shut the kernel down through the gateway (idempotent)."""
        if self._disposed:
            return
        self._disposed = True
        self._close()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader
        if not await client.delete_kernel(self._gateway, self.kernel_id, REST_TIMEOUT_S):
            log.warning(
                "kernel %s: the gateway at %s did not confirm its shutdown; it may still run "
                "there (the gateway's culling reaps it)",
                self.kernel_id,
                self._gateway.url,
            )

    def kill_sync(self) -> None:
        """Shut the kernel down without an event loop (exit-time cleanup); best effort."""
        if self._disposed:
            return
        self._disposed = True
        with contextlib.suppress(Exception):
            self._close()
        client.delete_kernel_sync(self._gateway, self.kernel_id, SYNC_DELETE_TIMEOUT_S)

    def publish(self) -> None:
        """Nothing to do: the gateway lists its kernels itself (``GET /api/kernels``)."""

    def _close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(Exception):
            self._conn.close()

    # -- channels ------------------------------------------------------------------------

    def execute(self, code: str, metadata: dict[str, Any], sink: MessageSink) -> str:
        """Send an execute_request whose messages go to ``sink``; returns its msg_id."""
        lemon = metadata.get(protocol.CELL_METADATA_KEY)
        if isinstance(lemon, dict) and "cwd" in lemon:
            # The host's directory does not exist where the kernel runs: scripts work in the
            # kernel's own working directory (docs/scale-out.md).
            metadata = {**metadata, protocol.CELL_METADATA_KEY: {**lemon}}
            del metadata[protocol.CELL_METADATA_KEY]["cwd"]
        content = execute_request_content(code)
        msg_id = self._new_id()
        self._sinks[msg_id] = sink
        self._send("shell", "execute_request", content, metadata=metadata, msg_id=msg_id)
        return msg_id

    def release(self, msg_id: str) -> None:
        self._sinks.pop(msg_id, None)

    def send_bridge_reply(self, content: dict[str, Any]) -> None:
        """A bridge reply, on the control channel (docs/comm-protocol.md §3)."""
        if not self._disposed:
            self._send("control", protocol.REPLY_MSG_TYPE, content)

    def _new_id(self) -> str:
        return uuid.uuid4().hex

    def _send(
        self,
        channel: str,
        msg_type: str,
        content: dict[str, Any],
        *,
        metadata: dict[str, Any] | None = None,
        msg_id: str | None = None,
    ) -> None:
        msg = {
            "channel": channel,
            "header": {
                "msg_id": msg_id or self._new_id(),
                "msg_type": msg_type,
                "username": "lemon_exec",
                "session": self._session,
                "date": datetime.now(UTC).isoformat(),
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": metadata or {},
            "content": content,
            "buffers": [],
        }
        if self.lost is not None:
            return  # the cell's watchdog sees the kernel gone
        try:
            future = self._conn.write_message(client.encode(msg))
        except WebSocketClosedError:
            self._lose("the websocket to the gateway closed")
            return
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is not None:
            self._lose("the websocket to the gateway closed")

    # -- reading -------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            while True:
                raw = await self._conn.read_message()
                if raw is None:
                    break
                _quickack(self._socket)
                if len(raw) > MAX_MESSAGE_BYTES:
                    self._dropped(client.peek_channel(raw), drop_note(len(raw)))
                else:
                    self._handle(raw)
                # Yield: a flood of queued messages must not starve the cells' watchdog.
                await asyncio.sleep(0)
        finally:
            if not self._disposed:
                self._lose("the websocket to the gateway closed")

    def _handle(self, raw: str | bytes) -> None:
        try:
            msg = client.decode(raw)
        except ValueError:
            self._faulted("a message from the gateway was malformed")
            return
        msg["msg_type"] = msg["header"].get("msg_type")
        channel = msg.get("channel")
        try:
            if channel == "iopub":
                self._route_iopub(msg)
            elif channel == "shell":
                self._route_reply(msg)
            # control replies (to bridge replies, none expected) and stdin: nothing to route
        except Exception:
            log.exception("error routing a kernel message")

    def _route_iopub(self, msg: dict[str, Any]) -> None:
        content = msg.get("content") or {}
        if msg["msg_type"] == "status" and content.get("execution_state") in _DEAD_STATES:
            self._lose(f"the gateway reports the kernel {content['execution_state']}")
            return
        if not self._iopub_seen.done():
            self._iopub_seen.set_result(None)
        sink = self._sinks.get(msg.get("parent_header", {}).get("msg_id", ""))
        if sink is not None:
            sink.on_iopub(msg)

    def _route_reply(self, msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "kernel_info_reply":
            if not self._info.done():
                self._info.set_result(dict(msg.get("content") or {}))
            return
        sink = self._sinks.get(msg.get("parent_header", {}).get("msg_id", ""))
        if sink is not None:
            sink.on_reply(msg)

    def _lose(self, why: str) -> None:
        """The kernel is gone for the host: its running cells end as crashed."""
        if self.lost is not None:
            return
        self.lost = why
        if not self._disposed:
            log.warning("kernel %s: %s", self.kernel_id, why)
        error = KernelStartError(f"execute_code: {why} before the kernel was ready")
        for waiter in (self._info, self._iopub_seen):
            if not waiter.done():
                waiter.set_exception(error)
                waiter.exception()  # retrieved: only a waiting start reports it
        self._dropped(_LINK, f"[{why}; the kernel and its state are lost]")

    def _dropped(self, channel: str, note: str) -> None:
        for sink in list(self._sinks.values()):
            try:
                sink.on_dropped(channel, note)
            except Exception:
                log.exception("error reporting a dropped kernel message")

    def _faulted(self, reason: str) -> None:
        self.invalid_messages += 1
        if self.fault is None:
            self.fault = reason
            log.warning("kernel %s: protocol fault: %s", self.kernel_id, reason)
        for sink in list(self._sinks.values()):
            try:
                sink.on_protocol_fault("websocket", reason)
            except Exception:
                log.exception("error reporting a protocol fault")


def _tcp_socket(conn: WebSocketClientConnection) -> socket.socket | None:
    """The websocket's TCP socket, set to send small messages at once (no Nagle delay)."""
    stream = getattr(conn.protocol, "stream", None)
    sock = getattr(stream, "socket", None)
    if not isinstance(sock, socket.socket):
        return None
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _quickack(sock: socket.socket | None) -> None:
    """Acknowledge what arrived at once (Linux; the flag does not stay set).

    Jupyter Server's websocket leaves Nagle's algorithm on, so the gateway holds a small
    message back until its previous one is acknowledged; with the usual delayed ACK
    (40 ms) every cell would wait that long between its busy status and its reply.
    """
    if sock is not None and _QUICKACK is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)
