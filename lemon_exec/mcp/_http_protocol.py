"""uvicorn's h11 protocol bounded by :class:`~lemon_exec.mcp._http_limits.HttpLimits`.

Kept apart from the limits so that only serving HTTP imports uvicorn.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from lemon_exec.mcp._http_limits import HttpLimits

__all__ = ["limited_protocol"]


_TIMEOUT_408 = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\ncontent-length: %d\r\n\r\n%s"
)
_BUSY_503 = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n%s"
)


def _response(template: bytes, text: str) -> bytes:
    body = text.encode()
    return template % (len(body), body)


def limited_protocol(limits: HttpLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol bounded by ``limits``: pass it as ``uvicorn.Config(http=...)``."""

    class LimitedH11Protocol(_LimitedH11Protocol):
        _limits = limits

    return LimitedH11Protocol


class _LimitedH11Protocol(H11Protocol):
    """One connection: uvicorn's h11 protocol plus the head and body timers and the cap.

    Reads uvicorn's per-connection state (``conn``, ``cycle``, ``connections``, ``loop``,
    ``timeout_keep_alive``), as its own subclasses do; the tests run against the version
    installed.
    """

    _limits: HttpLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self._limits.keep_alive_timeout_s  # type: ignore[assignment]
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._head_bytes = False  # part of a request head arrived
        self._waiting_since = time.monotonic()

    # -- the connection ----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self._open_count() > self._limits.max_connections and not self._evict_one():
            limit = self._limits.max_connections
            transport.write(
                _response(
                    _BUSY_503,
                    f"lemon-exec mcp: {limit} connections are open and all are serving "
                    "requests (--http-max-connections); try again shortly",
                )
            )
            transport.close()
            return
        self._update_timers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head()
        self._cancel_body()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:
            self._head_bytes = True
        super().data_received(data)
        self._update_timers()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start the next request's cycle
        self._update_timers()

    # -- the timers --------------------------------------------------------------------------

    def _update_timers(self) -> None:
        """Arm or cancel the head and body timers for the request phase the client is in."""
        if self.transport is None or self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.IDLE and self._waiting():
            if self._head_timer is None:
                self._waiting_since = time.monotonic()
                self._head_timer = self.loop.call_later(
                    self._limits.header_timeout_s, self._head_timed_out
                )
            return
        self._cancel_head()
        if state is h11.SEND_BODY:
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(
                    self._limits.body_timeout_s, self._body_timed_out
                )
        else:
            self._cancel_body()

    def _waiting(self) -> bool:
        """Whether no request of this connection is being served (the next head is due)."""
        return self.cycle is None or self.cycle.response_complete

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._head_bytes:  # a client that started a request learns why it ends
            seconds = self._limits.header_timeout_s
            self.transport.write(
                _response(
                    _TIMEOUT_408,
                    f"lemon-exec mcp: the request line and headers did not arrive within "
                    f"{seconds:g} s (--http-header-timeout)",
                )
            )
        self.transport.close()

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self.transport.is_closing():
            self.transport.close()  # the app's receive() then reports the disconnect

    def _cancel_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        self._head_bytes = False

    def _cancel_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # -- the cap -----------------------------------------------------------------------------

    def _open_count(self) -> int:
        """Connections not already closing (a closed one leaves the set a moment later)."""
        return sum(1 for c in self.connections if not _closing(c))

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for a request head; False if none."""
        waiting = [
            c
            for c in self.connections
            if c is not self
            and isinstance(c, _LimitedH11Protocol)
            and not _closing(c)
            and c.conn.their_state is h11.IDLE
            and c._waiting()
        ]
        if not waiting:
            return False
        oldest = min(waiting, key=lambda c: c._waiting_since)
        oldest.transport.close()
        return True


def _closing(connection: Any) -> bool:
    transport = getattr(connection, "transport", None)
    return transport is None or bool(transport.is_closing())
