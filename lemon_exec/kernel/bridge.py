"""The kernel half of the per-cell bridge: frames out on IOPub, replies in on control.

One :class:`CellBridge` exists per lemon script cell. Kernel → host frames are ``comm_msg``
messages on IOPub whose parent is the cell's execute_request, so the host can tell them from
anything else on the kernel (a person's own executions included). With a host of our own
(its link, see hostlink.py) a frame goes from the calling thread straight onto the link,
unless output sent before it still waits in the IO thread. Host → kernel replies arrive on
the link, read by the threads that wait for them, or on the control channel, delivered from
the control thread, which keeps running while the main thread is busy in the script
(docs/comm-protocol.md §3).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from jupyter_client.session import extract_header

from lemon_exec.wire import json_strings, jupyter_messages, protocol, text_budget


class ToolError(Exception):
    """A helper call failed: denied by policy, an error in the tool, or a budget limit hit."""


class _Pending:
    """A frame that waits for the host's reply (and, before it, the host's ack)."""

    __slots__ = ("acked", "answered", "event", "reply")

    def __init__(self, answered: threading.Event | None = None) -> None:
        self.event = threading.Event()
        self.reply: dict[str, Any] | None = None
        #: The host has the frame: from then on the wait has no bound but the cell's end.
        self.acked = False
        #: Also set on an answer: the event a batch() waits on for any of its calls.
        self.answered = answered

    def wake(self) -> None:
        self.event.set()
        if self.answered is not None:
            self.answered.set()


def ack_timeout_s() -> float:
    """How long a frame may go unacknowledged before the helper fails (protocol.py)."""
    try:
        value = float(os.environ.get(protocol.ACK_TIMEOUT_ENV, ""))
    except ValueError:
        return protocol.ACK_TIMEOUT_S
    return value if value > 0 else protocol.ACK_TIMEOUT_S


class CellBridge:
    """Sends one cell's frames and matches the host's replies to the waiting threads."""

    def __init__(
        self,
        *,
        session: Any,
        iopub_socket: Any,
        parent: dict[str, Any],
        comm_id: str,
        token: str,
        generation: int,
        max_text_bytes: int,
        max_images: int | None = None,
        max_image_bytes: int | None = None,
    ) -> None:
        self.comm_id = comm_id
        self.generation = generation
        self._session = session
        self._iopub = iopub_socket
        #: ipykernel's IOPub thread behind the socket: it can send a frame directly.
        self._io_thread = getattr(iopub_socket, "io_thread", None)
        self._send_direct = getattr(self._io_thread, "send_direct", None)
        #: The host link, when the host gave one: waiters read their replies off it.
        self._link = getattr(self._io_thread, "host_link", None)
        # Packed once per cell: every frame carries the cell's request as its parent.
        self._parent_bytes: bytes = session.pack(extract_header(parent))
        self._pid = os.getpid()  # made per cell, in the kernel's main thread
        self._token = token
        self._topic = f"comm-{comm_id}".encode()
        self._max_text_bytes = max_text_bytes
        self._lock = threading.Lock()
        # Held while a text block is numbered and sent; never taken inside _lock.
        self._text_lock = threading.Lock()
        self._next_call_id = 0
        self._text_n = 0
        self._text_bytes = 0
        self._notify_n = 0
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._closed = False
        self._ack_timeout_s = ack_timeout_s()
        # image(): the host's budgets when it sent them, else only what one message can hold.
        self._max_images = max_images if max_images is not None else protocol.MAX_IMAGE_COUNT
        self._max_image_bytes = min(
            max_image_bytes if max_image_bytes is not None else protocol.MAX_IMAGE_BYTES,
            protocol.MAX_IMAGE_BYTES,
        )
        self._image_n = 0
        self._images_shown = 0
        self._image_bytes = 0

    # -- kernel → host ------------------------------------------------------------------

    def call(self, tool: str, params: dict[str, Any]) -> str:
        """Run one helper call on the host and return its text; raise ToolError on failure."""
        key, pending = self._start_call(tool, params)
        return _call_result(tool, self._await(key, pending))

    def call_many(
        self, calls: Sequence[tuple[str, dict[str, Any]]], window: int
    ) -> list[str | ToolError]:
        """Run helper calls with up to ``window`` in flight; each one's text or ToolError.

        Pipelined from the calling thread: a new frame goes out whenever a call in flight is
        answered (any of them, so one slow call does not hold up the rest), and a batch
        costs no thread and no wake-up per call. Each call is a call of its own on the host
        (its id, its slot, its budget charge).
        """
        results: list[str | ToolError] = [ToolError(protocol.CELL_CLOSED)] * len(calls)
        answered = threading.Event()  # set whenever a call of this batch is answered
        in_flight: dict[tuple[str, int], tuple[int, str, _Pending, float]] = {}
        queued = iter(enumerate(calls))
        try:
            while True:
                while len(in_flight) < window and (item := next(queued, None)) is not None:
                    index, (tool, params) = item
                    try:
                        key, pending = self._start_call(tool, params, answered)
                    except ToolError as exc:  # this call's own failure (e.g. a bad argument)
                        results[index] = exc
                    else:
                        in_flight[key] = (index, tool, pending, time.monotonic())
                if not in_flight:
                    return results
                self._wait(answered, 0.25)  # short slices: SIGINT must get through
                answered.clear()  # before the scan: a later answer sets it again
                now = time.monotonic()
                for key, (index, tool, pending, sent) in list(in_flight.items()):
                    error = None
                    if pending.event.is_set() or self._closed:
                        if pending.reply is None:
                            error = ToolError(protocol.CELL_ENDED)
                    elif not pending.acked and now - sent > self._ack_timeout_s:
                        error = ToolError(
                            protocol.NO_REPLY.format(timeout=self._ack_timeout_s, kind=key[0])
                        )
                    else:
                        continue
                    del in_flight[key]
                    with self._lock:
                        self._pending.pop(key, None)
                    if error is not None:
                        results[index] = error
                        continue
                    assert pending.reply is not None
                    try:
                        results[index] = _call_result(tool, pending.reply)
                    except ToolError as exc:
                        results[index] = exc
        finally:  # interrupted: nobody waits for the calls still in flight
            with self._lock:
                for key in in_flight:
                    self._pending.pop(key, None)

    def _start_call(
        self, tool: str, params: dict[str, Any], answered: threading.Event | None = None
    ) -> tuple[tuple[str, int], _Pending]:
        """Send one call frame; the key and pending entry its reply will be matched to."""
        with self._lock:
            self._check_open()
            self._next_call_id += 1
            call_id = self._next_call_id
        frame = protocol.call_frame(call_id, self._token, tool, params)
        key = (protocol.CALL, call_id)
        return key, self._register_and_send(key, frame, answered)

    def text(self, value: object) -> None:
        """Emit one text() block; acknowledged by the host before it returns (write-through).

        The block number is taken and the block's frames are sent under one lock, so blocks
        from any thread reach the host in the order of their numbers and a large block's
        continuation frames are never interleaved with another block's.
        """
        text = text_budget.normalize_text(value)
        encoded = json_strings.json_string_bytes(text)  # once: the cost, frame sizes and the frame
        encoded_len = len(encoded)
        with self._text_lock:
            with self._lock:
                self._check_open()
                n = self._text_n + 1
                cost = text_budget.text_cost(n, encoded_len)
                if self._text_bytes + cost > self._max_text_bytes:
                    raise ToolError(
                        protocol.KERNEL_TEXT_BUDGET.format(
                            cost=cost,
                            remaining=self._max_text_bytes - self._text_bytes,
                            limit=self._max_text_bytes,
                        )
                    )
                self._text_n = n
                self._text_bytes += cost
                key = (protocol.TEXT, n)
                pending = _Pending()
                self._pending[key] = pending
            sent = 0
            try:
                self._flush_output()
                frames = text_budget.text_frames(n, self._token, text, encoded_len)
                for frame in frames:
                    self._send_unchecked(frame, encoded if len(frames) == 1 else None)
                    sent += 1
            except BaseException:
                with self._lock:
                    self._pending.pop(key, None)
                    # The host never charges a block it did not complete. With nothing sent
                    # the number is unused and handed back; after a partial send it stays
                    # taken, and the host abandons the partial block when the next arrives.
                    self._text_bytes -= cost
                    if sent == 0:
                        self._text_n = n - 1
                raise
        reply = self._await(key, pending)
        if reply.get("ok") is not True:
            with self._lock:
                self._text_bytes -= cost  # refused: the host charged nothing either
            raise ToolError(str(reply.get("error") or protocol.TEXT_REFUSED))

    def image(self, data: bytes, mime: str | None, alt: str | None) -> None:
        """Show one image; acknowledged by the host before it returns (write-through).

        The bytes travel as the message's binary buffer, never encoded. Sent under the text
        lock, so an image keeps its place among the text() blocks of every thread. The
        budgets are checked here first (nothing is sent over them) and by the host.
        """
        size = len(data)
        with self._text_lock:
            with self._lock:
                self._check_open()
                if self._images_shown >= self._max_images:
                    raise ToolError(protocol.IMAGE_COUNT_BUDGET.format(limit=self._max_images))
                remaining = self._max_image_bytes - self._image_bytes
                if size > remaining:
                    raise ToolError(
                        protocol.IMAGE_BYTES_BUDGET.format(
                            size=size, remaining=remaining, limit=self._max_image_bytes
                        )
                    )
                n = self._image_n + 1
                self._image_n = n
                self._images_shown += 1
                self._image_bytes += size
                key = (protocol.IMAGE, n)
                pending = _Pending()
                self._pending[key] = pending
            try:
                frame = protocol.image_frame(n, self._token, size, mime, alt)
                _check_frame_size(frame)
                self._flush_output()
                self._send_unchecked(frame, buffers=(data,))
            except BaseException:
                with self._lock:  # nothing was sent: the number and the budget are unused
                    self._pending.pop(key, None)
                    self._image_n = n - 1
                    self._images_shown -= 1
                    self._image_bytes -= size
                raise
        reply = self._await(key, pending)
        if reply.get("ok") is not True:
            with self._lock:  # refused: the host charged nothing either (its number is used)
                self._images_shown -= 1
                self._image_bytes -= size
            raise ToolError(str(reply.get("error") or protocol.IMAGE_REFUSED))

    def notify(self, message: object) -> None:
        """Send a progress message; fire-and-forget, capped per message and per run."""
        msg = text_budget.truncate_utf8(
            text_budget.normalize_text(message), protocol.NOTIFY_MAX_BYTES
        )
        with self._lock:
            if self._closed or self._notify_n >= protocol.NOTIFY_MAX_COUNT:
                return  # beyond the cap notify() is silently dropped, as specified
            self._notify_n += 1
            n = self._notify_n
        self._send(protocol.notify_frame(n, self._token, msg))

    def _register_and_send(
        self,
        key: tuple[str, int],
        frame: dict[str, Any],
        answered: threading.Event | None = None,
        *,
        size_checked: bool = False,
    ) -> _Pending:
        pending = _Pending(answered)
        with self._lock:
            self._pending[key] = pending
        try:
            self._send(frame, size_checked=size_checked)
        except BaseException:
            with self._lock:
                self._pending.pop(key, None)
            raise
        return pending

    def _await(self, key: tuple[str, int], pending: _Pending) -> dict[str, Any]:
        # The host acknowledges a call as soon as it has the frame, and answers a text block
        # at once: a frame unacknowledged for this long was lost on the way (e.g. dropped by
        # a relay), and waiting longer would only hang the script.
        deadline = time.monotonic() + self._ack_timeout_s
        try:
            # Wait in short slices: the cell may end (close() wakes us) and the main thread
            # must stay interruptible by SIGINT while it waits.
            while not self._wait(pending.event, 0.25):
                if self._closed:
                    break
                if not pending.acked and time.monotonic() > deadline:
                    raise ToolError(
                        protocol.NO_REPLY.format(timeout=self._ack_timeout_s, kind=key[0])
                    )
        finally:
            with self._lock:
                self._pending.pop(key, None)
        if pending.reply is None:
            raise ToolError(protocol.CELL_ENDED)
        return pending.reply

    def _wait(self, event: threading.Event, timeout: float) -> bool:
        link = self._link
        if link is not None:
            return bool(link.wait(event, timeout))  # reads the replies itself (hostlink.py)
        return event.wait(timeout)  # replies come on control, from the control thread

    def _send(self, frame: dict[str, Any], *, size_checked: bool = False) -> None:
        if not size_checked:
            _check_frame_size(frame)
        self._flush_output()
        self._send_unchecked(frame)

    @staticmethod
    def _flush_output() -> None:
        # Flush first so prints made before a frame reach the host before it (order kept).
        stdout, stderr = sys.stdout, sys.stderr  # during a script, usually one merged stream
        for stream in (stdout, stderr) if stderr is not stdout else (stdout,):
            if stream is not None:
                stream.flush()

    def _send_unchecked(
        self,
        frame: dict[str, Any],
        encoded_text: bytes | None = None,
        buffers: tuple[bytes, ...] = (),
    ) -> None:
        if os.getpid() != self._pid:
            # A forked child must not use its parent's sockets; nothing it sent would arrive,
            # and a helper would wait forever for its reply.
            raise ToolError(
                "helpers, text() and notify() work only in the kernel process, not in a "
                f"forked child (pid {os.getpid()})"
            )
        self._check_open()
        try:
            content = jupyter_messages.comm_content(self.comm_id, frame, encoded_text)
        except UnicodeEncodeError:
            # A lone surrogate in helper arguments cannot be serialised; nothing was sent.
            raise ToolError(protocol.BAD_UNICODE) from None
        with self._lock:
            self._check_open()
            frames = jupyter_messages.pack_signed(
                self._session, "comm_msg", content, self._parent_bytes, self._topic, buffers
            )
            if self._send_direct is None or not self._send_direct(frames):
                self._iopub.send_multipart(frames)

    def _check_open(self) -> None:
        if self._closed:
            raise ToolError(protocol.CELL_CLOSED)

    # -- host → kernel (called from the control thread) -----------------------------------

    def deliver(self, reply: dict[str, Any]) -> bool:
        """Hand a host reply to the thread waiting for it; False when nobody waits."""
        target = protocol.reply_target(reply)
        if target is None:
            return False
        kind, number, is_ack = target
        with self._lock:
            pending = self._pending.get((kind, number))
        if is_ack:
            if pending is None:
                return False
            pending.acked = True  # the wait for the answer is now bounded by the cell only
            return True
        if pending is None or pending.event.is_set():
            return False
        pending.reply = reply
        pending.wake()
        return True

    def close(self) -> None:
        """End the cell: refuse new frames and wake every waiter with a ToolError."""
        with self._lock:
            self._closed = True
            waiting = list(self._pending.values())
        for pending in waiting:
            pending.wake()


def _call_result(tool: str, reply: dict[str, Any]) -> str:
    content = reply.get("content")
    if reply.get("ok") is True and isinstance(content, str):
        return content
    raise ToolError(str(reply.get("error") or f"{tool} failed"))


def _check_frame_size(frame: dict[str, Any]) -> None:
    size = text_budget.frame_size(frame)
    if size > protocol.FRAME_CAP_BYTES:
        raise ToolError(protocol.FRAME_TOO_LARGE.format(size=size, cap=protocol.FRAME_CAP_BYTES))
