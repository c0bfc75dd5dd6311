"""The host half of the per-cell bridge: authenticate, account, dispatch and answer frames.

The kernel sends ``call``, ``text`` and ``notify`` frames (docs/comm-protocol.md). This
dispatcher keeps the spec's invariants: authentication comes before any budget or lookup;
a call slot is spent before dispatch; a request id is answered once and a replay is refused;
at most ``max_parallel`` tool calls run at once; the result-byte budget is charged as each
call returns, and an over-budget result is answered with an error and not charged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec._constants import GRACE_S
from lemon_exec.errors import ToolDenied, ToolFailure
from lemon_exec.kernel import protocol
from lemon_exec.tools import ToolCall, ToolHost

log = logging.getLogger(__name__)

AUTH_FAILED = "rpc authentication failed"
REPLAYED = "rpc request already processed"
TOO_LARGE = f"rpc frame too large (max {protocol.FRAME_CAP_BYTES} bytes)"


def new_token() -> str:
    """A fresh 256-bit bridge token: 43 url-safe characters."""
    token = secrets.token_urlsafe(protocol.TOKEN_BYTES)
    assert len(token) == protocol.TOKEN_LENGTH
    return token


@dataclass
class BridgeStats:
    """The accounting of one cell, reported in the result's details."""

    calls: int = 0
    denied: int = 0
    errors: int = 0
    result_bytes: int = 0
    tools: set[str] = field(default_factory=set)
    text_bytes: int = 0
    notifications: int = 0
    accounting_loss: bool = False

    def details(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rpc_calls": self.calls,
            "rpc_denied": self.denied,
            "rpc_errors": self.errors,
            "rpc_bytes": self.result_bytes,
            "rpc_tools": sorted(self.tools),
        }
        if self.accounting_loss:
            out["rpc_accounting_loss"] = True
        return out


@dataclass(frozen=True)
class BridgeLimits:
    max_calls: int
    max_result_bytes: int
    max_text_bytes: int
    max_parallel: int


class HostBridge:
    """Serves one cell's frames: :meth:`handle` each ``comm_msg``, :meth:`aclose` at the end."""

    def __init__(
        self,
        *,
        tool_host: ToolHost,
        enabled_tools: tuple[str, ...],
        cwd: Path,
        limits: BridgeLimits,
        send_reply: Callable[[dict[str, Any]], None],
        on_notify: Callable[[str], None] | None = None,
    ) -> None:
        self.token = new_token()
        self.comm_id = secrets.token_hex(16)
        self.stats = BridgeStats()
        self.text_blocks: list[str] = []
        self._tool_host = tool_host
        self._enabled = frozenset(enabled_tools)
        self._cwd = cwd
        self._limits = limits
        self._send_reply = send_reply
        self._on_notify = on_notify
        self._seen_ids: set[int] = set()
        self._slots = asyncio.Semaphore(limits.max_parallel)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- frames ----------------------------------------------------------------------------

    def handle(self, data: Any) -> None:
        """Handle one kernel → host frame (the ``data`` of a comm_msg)."""
        if self._closed:
            return  # tool work after the run would be work nobody waits for
        try:
            self._handle(data)
        except Exception:
            # A fault in the dispatcher itself: the accounting can no longer be proven.
            log.exception("bridge dispatcher fault")
            self.stats.accounting_loss = True

    def _handle(self, data: Any) -> None:
        if not isinstance(data, dict):
            return  # malformed frames are consumed, never counted
        kind = data.get("type")
        if kind == protocol.CALL:
            self._handle_call(data)
        elif kind == protocol.TEXT:
            self._handle_text(data)
        elif kind == protocol.NOTIFY:
            self._handle_notify(data)

    def _authentic(self, data: dict[str, Any]) -> bool:
        token = data.get("token")
        return isinstance(token, str) and hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), self.token.encode()
        )

    def _handle_call(self, data: dict[str, Any]) -> None:
        call_id = data.get("id")
        if not self._authentic(data):
            self.stats.denied += 1
            self._reply_error(call_id, AUTH_FAILED)
            return
        if protocol.frame_size(data) > protocol.FRAME_CAP_BYTES:
            self._reply_error(call_id, TOO_LARGE)
            return
        if not _is_positive_int(call_id):
            self._reply_error(call_id, "rpc request malformed: id must be a positive integer")
            return
        if call_id in self._seen_ids:
            self._reply_error(call_id, REPLAYED)
            return
        self._seen_ids.add(call_id)
        if self.stats.calls >= self._limits.max_calls:
            self.stats.errors += 1
            self._reply_error(
                call_id,
                f"rpc call limit exceeded (max {self._limits.max_calls} calls per script)",
            )
            return
        self.stats.calls += 1  # the slot is spent before dispatch
        tool, params = data.get("tool"), data.get("params")
        if not isinstance(tool, str) or not isinstance(params, dict):
            self.stats.errors += 1
            self._reply_error(
                call_id, "rpc request malformed: tool must be a string and params an object"
            )
            return
        if tool not in self._enabled or tool not in self._tool_host.names():
            self.stats.errors += 1
            self._reply_error(call_id, f"unknown tool: {tool}")
            return
        self.stats.tools.add(tool)
        call = ToolCall(tool=tool, params=params, cwd=self._cwd, call_id=call_id)
        task = asyncio.get_running_loop().create_task(self._dispatch(call))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dispatch(self, call: ToolCall) -> None:
        try:
            await self._slots.acquire()
        except asyncio.CancelledError:
            self.stats.errors += 1  # the cell ended while the call waited for a slot
            raise
        try:
            try:
                result = await self._tool_host.invoke(call)
            except ToolDenied as exc:
                self.stats.denied += 1
                self._reply_error(call.call_id, str(exc))
                return
            except ToolFailure as exc:
                self.stats.errors += 1
                self._reply_error(call.call_id, str(exc))
                return
            except asyncio.CancelledError:
                self.stats.errors += 1  # the cell ended while the call was in flight
                raise
            except Exception as exc:  # a tool host bug must still answer the call
                log.exception("tool host failed")
                self.stats.errors += 1
                self._reply_error(call.call_id, f"{call.tool} failed: {type(exc).__name__}")
                return
        finally:
            self._slots.release()
        size = len(result.encode("utf-8", "replace"))
        if self.stats.result_bytes + size > self._limits.max_result_bytes:
            self.stats.errors += 1
            self._reply_error(
                call.call_id,
                f"rpc result budget exceeded: this result is {size} bytes, "
                f"{self._limits.max_result_bytes - self.stats.result_bytes} of "
                f"max_rpc_result_bytes ({self._limits.max_result_bytes}) remain",
            )
            return
        self.stats.result_bytes += size
        self._reply({"id": call.call_id, "ok": True, "content": result})

    def _handle_text(self, data: dict[str, Any]) -> None:
        n = data.get("n")
        if not self._authentic(data):
            self.stats.denied += 1
            self._reply({"n": n, "ok": False, "error": AUTH_FAILED})
            return
        text = data.get("text")
        if not _is_positive_int(n) or not isinstance(text, str):
            return  # malformed: consumed, not counted
        if protocol.frame_size(data) > protocol.FRAME_CAP_BYTES:
            self._reply({"n": n, "ok": False, "error": TOO_LARGE})
            return
        if n != len(self.text_blocks) + 1:
            self._reply(
                {
                    "n": n,
                    "ok": False,
                    "error": REPLAYED
                    if n <= len(self.text_blocks)
                    else "rpc request malformed: text blocks must be numbered in order",
                }
            )
            return
        text = protocol.normalize_text(text)
        cost = protocol.text_frame_bytes(n, text)
        if self.stats.text_bytes + cost > self._limits.max_text_bytes:
            self._reply(
                {
                    "n": n,
                    "ok": False,
                    "error": (
                        f"text() budget exceeded (max_text_bytes {self._limits.max_text_bytes})"
                    ),
                }
            )
            return
        self.stats.text_bytes += cost
        self.text_blocks.append(text)
        self._reply({"n": n, "ok": True})

    def _handle_notify(self, data: dict[str, Any]) -> None:
        msg = data.get("msg")
        if not self._authentic(data) or not isinstance(msg, str):
            return  # fire-and-forget: forged or malformed notifications are dropped
        if protocol.frame_size(data) > protocol.FRAME_CAP_BYTES:
            return  # the kernel never sends one this large: malformed, not counted
        if self.stats.notifications >= protocol.NOTIFY_MAX_COUNT:
            return
        self.stats.notifications += 1
        if self._on_notify is not None:
            message = protocol.truncate_utf8(
                protocol.normalize_text(msg), protocol.NOTIFY_MAX_BYTES
            )
            try:
                self._on_notify(message)
            except Exception:
                log.exception("on_update callback failed")

    # -- replies and teardown ------------------------------------------------------------

    def _reply(self, content: dict[str, Any]) -> None:
        if self._closed:
            return
        self._send_reply({"comm_id": self.comm_id, **content})

    def _reply_error(self, call_id: Any, error: str) -> None:
        self._reply({"id": call_id, "ok": False, "error": error})

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        """End the cell: cancel in-flight calls (withdrawing pending approvals) and wait.

        The wait is bounded: a tool that ignores cancellation is abandoned after one grace
        period (its reply is never sent) and the accounting becomes a lower bound.
        """
        self._closed = True
        deadline = time.monotonic() + GRACE_S
        while pending := [t for t in self._tasks if not t.done()]:
            for task in pending:
                task.cancel()  # repeated each round: a swallowed cancel must not hang the cell
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("%d tool call(s) ignored cancellation; abandoned", len(pending))
                self.stats.accounting_loss = True
                return
            await asyncio.wait(pending, timeout=min(0.05, remaining))


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
