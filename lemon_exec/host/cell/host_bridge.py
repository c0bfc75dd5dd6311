"""The host half of the per-cell bridge: authenticate, account, dispatch and answer frames.

The kernel sends ``call``, ``text``, ``notify`` and ``image`` frames (docs/comm-protocol.md;
images are checked and kept by :mod:`.image_frames`). This
dispatcher keeps the spec's invariants: authentication comes before any budget or lookup;
a call slot is spent before dispatch; a request id is answered once and a replay is refused;
at most ``max_parallel`` tool calls run at once (calls of upstream MCP server tools on a lane
of their own, at most ``max_parallel_mcp``); the result-byte budget is charged as each call
returns, and an over-budget result is answered with an error and not charged.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec._constants import GRACE_S
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.details import Details
from lemon_exec.errors import ToolDenied, ToolFailure
from lemon_exec.host.cell.image_frames import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_EDGE,
    DEFAULT_MAX_IMAGES,
    ImageFrames,
    ImageLimits,
)
from lemon_exec.tools import ToolCall, ToolHost
from lemon_exec.wire import json_strings, protocol, text_budget
from lemon_exec.wire.frame_fields import bad_fields, positive_int

log = logging.getLogger(__name__)

#: A call still running this long after its frame arrived is acknowledged (see _handle_call);
#: far below the kernel's ack timeout (protocol.ACK_TIMEOUT_S).
ACK_AFTER_S = 0.2


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

    def details(self) -> Details:
        out: Details = {
            "rpc_calls": self.calls,
            "rpc_denied": self.denied,
            "rpc_errors": self.errors,
            "rpc_bytes": self.result_bytes,
            "rpc_tools": sorted(self.tools),
        }
        if self.accounting_loss:
            out["rpc_accounting_loss"] = True
        return out


@dataclass
class _PartialBlock:
    """A text block sent in several frames, collected until its last frame arrives."""

    n: int
    pieces: list[str] = field(default_factory=list)
    encoded: int = 0  # sum of the pieces' json.dumps lengths, quotes excluded
    error: str | None = None  # set once the block cannot fit: later frames are consumed


@dataclass(frozen=True)
class BridgeLimits:
    max_calls: int
    max_result_bytes: int
    max_text_bytes: int
    #: Calls in flight at once: the five helpers and host-defined tools (max_parallel_rpc).
    max_parallel: int
    #: Calls of upstream MCP server tools in flight at once, on their own lane: they wait on
    #: another process, not on this host, so they need not queue behind the built-ins.
    max_parallel_mcp: int = 16
    #: The image channel's budgets (image_frames.py).
    max_images: int = DEFAULT_MAX_IMAGES
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_edge: int = DEFAULT_MAX_IMAGE_EDGE

    @classmethod
    def of(cls, config: ExecuteCodeConfig) -> BridgeLimits:
        """One run's bridge budgets, as ``config`` sets them."""
        return cls(
            max_calls=config.max_rpc_calls,
            max_result_bytes=config.max_rpc_result_bytes,
            max_text_bytes=config.max_text_bytes,
            max_parallel=config.max_parallel_rpc,
            max_parallel_mcp=config.max_parallel_mcp,
            max_images=config.max_images,
            max_image_bytes=config.max_image_bytes,
            max_image_edge=config.max_image_edge,
        )


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
        on_text: Callable[[str], None] | None = None,
        spill_dir: Path | None = None,
        identity: tuple[str, str] | None = None,
    ) -> None:
        # ``identity`` (comm id, token): chosen by a kernel that opens its cells itself
        # (kernel/playground.py); else made here and sent in the cell setup.
        self.comm_id, self.token = identity or (secrets.token_hex(16), new_token())
        self.stats = BridgeStats()
        self.text_blocks: list[str] = []
        self._tool_host = tool_host
        self._enabled = frozenset(enabled_tools)
        self._cwd = cwd
        self._limits = limits
        self._send_reply = send_reply
        self._on_notify = on_notify
        self._on_text = on_text  # each accepted text() block, live (a job's poll)
        self._seen_ids: set[int] = set()
        self._notify_seen: set[int] = set()  # notify numbers delivered (1..NOTIFY_MAX_COUNT)
        self._text_next = 1  # the number the next text block must carry
        self._partial: _PartialBlock | None = None  # a block still receiving frames
        self._slots = asyncio.Semaphore(limits.max_parallel)
        self._mcp_slots = asyncio.Semaphore(limits.max_parallel_mcp)
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        #: The cell's images (image frames); ``spill_dir`` keeps downscaled originals.
        self.images = ImageFrames(
            ImageLimits(limits.max_images, limits.max_image_bytes, limits.max_image_edge),
            spill_dir,
            self._reply,
        )

    # -- frames ----------------------------------------------------------------------------

    def handle(self, data: Any, buffers: Sequence[bytes] = ()) -> None:
        """Handle one kernel → host frame (the ``data`` of a comm_msg, and its buffers)."""
        if self._closed:
            return  # tool work after the run would be work nobody waits for
        try:
            self._handle(data, buffers)
        except Exception:
            # A fault in the dispatcher itself: the accounting can no longer be proven.
            log.exception("bridge dispatcher fault")
            self.stats.accounting_loss = True

    def _handle(self, data: Any, buffers: Sequence[bytes] = ()) -> None:
        if not isinstance(data, dict):
            return  # malformed frames are consumed, never counted
        kind = data.get("type")
        if kind == protocol.CALL:
            self._handle_call(data)
        elif kind == protocol.TEXT:
            self._handle_text(data)
        elif kind == protocol.NOTIFY:
            self._handle_notify(data)
        elif kind == protocol.IMAGE:
            self._handle_image(data, buffers)

    def _handle_image(self, data: dict[str, Any], buffers: Sequence[bytes]) -> None:
        if not self._authentic(data):
            self.stats.denied += 1
            self._reply(protocol.image_reply(data.get("n"), protocol.AUTH_FAILED))
            return
        self.images.take(data, buffers, len(self.text_blocks))

    def _authentic(self, data: dict[str, Any]) -> bool:
        token = data.get("token")
        return isinstance(token, str) and hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), self.token.encode()
        )

    def _handle_call(self, data: dict[str, Any]) -> None:
        call_id = data.get("id")
        if not self._authentic(data):
            self.stats.denied += 1
            self._reply_error(call_id, protocol.AUTH_FAILED)
            return
        if text_budget.frame_size(data) > protocol.FRAME_CAP_BYTES:
            self._reply_error(call_id, protocol.TOO_LARGE)
            return
        if not positive_int(call_id):
            self._reply_error(call_id, protocol.BAD_CALL_ID)
            return
        if call_id in self._seen_ids:
            self._reply_error(call_id, protocol.REPLAYED)
            return
        self._seen_ids.add(call_id)
        if self.stats.calls >= self._limits.max_calls:
            self.stats.errors += 1
            self._reply_error(call_id, protocol.CALL_LIMIT.format(max_calls=self._limits.max_calls))
            return
        self.stats.calls += 1  # the slot is spent before dispatch
        bad = bad_fields(protocol.CALL, data)
        if bad:
            self.stats.errors += 1
            shape = "tool" in bad or "params" in bad
            error = protocol.BAD_CALL_SHAPE if shape else protocol.BAD_FIELDS
            self._reply_error(call_id, error.format(fields=", ".join(bad)))
            return
        tool: str = data["tool"]
        params: dict[str, Any] = data["params"]
        if tool not in self._enabled or tool not in self._tool_host.names():
            self.stats.errors += 1
            self._reply_error(call_id, protocol.UNKNOWN_TOOL.format(tool=tool))
            return
        self.stats.tools.add(tool)
        call = ToolCall(
            tool=tool,
            params=params,
            cwd=self._cwd,
            call_id=call_id,
            notify=self._emit_notify,
            result_limit=max(0, self._limits.max_result_bytes - self.stats.result_bytes),
        )
        spec = self._tool_host.registry.get(tool)
        is_mcp = spec is not None and spec.mcp is not None
        if not is_mcp and not self._slots.locked():
            # Answered right here when the tool host can run the call without waiting (a
            # small read, no hooks): no task, slot wait or ack timer on the hot path. Only
            # while a slot is free, so the parallel bound holds for it too.
            try:
                result = self._tool_host.run_inline(call)
            except Exception as exc:
                self._refuse(call, exc)
                return
            if result is not None:
                self._answer(call, result)
                return
        loop = asyncio.get_running_loop()
        slots = self._mcp_slots if is_mcp else self._slots
        task = loop.create_task(self._dispatch(call, slots))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # A call still running after ACK_AFTER_S is acknowledged, so the kernel, which bounds
        # only the wait for an ack or answer (a lost frame fails fast), waits on for the
        # tool. Most calls answer sooner and cost no extra message on the hot path.
        ack = loop.call_later(ACK_AFTER_S, self._reply, protocol.call_ack(call_id))
        task.add_done_callback(lambda _task: ack.cancel())

    async def _dispatch(self, call: ToolCall, slots: asyncio.Semaphore) -> None:
        try:
            await slots.acquire()
        except asyncio.CancelledError:
            self.stats.errors += 1  # the cell ended while the call waited for a slot
            raise
        try:
            result = await self._tool_host.invoke(call)
        except asyncio.CancelledError:
            self.stats.errors += 1  # the cell ended while the call was in flight
            raise
        except Exception as exc:
            self._refuse(call, exc)
            return
        finally:
            slots.release()
        self._answer(call, result)

    def _refuse(self, call: ToolCall, exc: Exception) -> None:
        """Answer a call whose tool was denied or failed (counted as such)."""
        if isinstance(exc, ToolDenied):
            self.stats.denied += 1
            error = str(exc)
        elif isinstance(exc, ToolFailure):
            self.stats.errors += 1
            error = str(exc)
        else:  # a tool host bug must still answer the call
            log.error("tool host failed", exc_info=exc)
            self.stats.errors += 1
            error = f"{call.tool} failed: {type(exc).__name__}"
        self._reply_error(call.call_id, error)

    def _answer(self, call: ToolCall, result: str) -> None:
        """Charge a call's result to the byte budget and send it (or refuse it over budget)."""
        size = len(result.encode("utf-8", "replace"))
        if self.stats.result_bytes + size > self._limits.max_result_bytes:
            self.stats.errors += 1
            limit = self._limits.max_result_bytes
            remaining = limit - self.stats.result_bytes
            self._reply_error(
                call.call_id,
                protocol.RESULT_BUDGET.format(size=size, remaining=remaining, limit=limit),
            )
            return
        self.stats.result_bytes += size
        self._reply(protocol.call_result(call.call_id, result))

    def _handle_text(self, data: dict[str, Any]) -> None:
        n = data.get("n")
        if not self._authentic(data):
            self.stats.denied += 1
            self._reply(protocol.text_reply(n, protocol.AUTH_FAILED))
            return
        if bad_fields(protocol.TEXT, data):
            return  # malformed: consumed, not counted
        n = data["n"]
        text: str = data["text"]
        more: bool = data.get("more", False)
        text = text_budget.normalize_text(text)
        # Normalising never changes the encoded length (\udXXX and \ufffd are both 6 bytes).
        encoded_len = json_strings.json_string_len(text)
        if text_budget.frame_size_with_text(data, encoded_len) > protocol.FRAME_CAP_BYTES:
            self._reply(protocol.text_reply(n, protocol.TOO_LARGE))
            return
        partial = self._partial
        if n != self._text_next:
            if partial is not None and n == partial.n + 1:
                # The kernel moved on from a block it could not finish (interrupted while
                # sending): abandon that block, uncharged, so it cannot poison this one.
                self._end_block(partial.n, protocol.TEXT_ABANDONED)
                partial = None
            else:
                error = protocol.REPLAYED if n < self._text_next else protocol.OUT_OF_ORDER
                self._reply(protocol.text_reply(n, error))
                return
        if partial is None and not more:  # the common case: a block in one frame
            self._accept_block(n, text, text_budget.text_cost(n, encoded_len))
            return
        if partial is None:
            partial = self._partial = _PartialBlock(n)
        if partial.error is None:
            partial.pieces.append(text)
            partial.encoded += encoded_len - 2  # without the piece's quotes
            if text_budget.text_cost(n, partial.encoded + 2) > self._text_remaining():
                partial.error = self._text_budget_error()
                partial.pieces.clear()  # keep consuming the block's frames, not its text
        if more:
            return
        self._partial = None
        if partial.error is not None:
            self._end_block(n, partial.error)
            return
        self._accept_block(
            n, "".join(partial.pieces), text_budget.text_cost(n, partial.encoded + 2)
        )

    def _accept_block(self, n: int, text: str, cost: int) -> None:
        """Charge and keep block ``n`` (or refuse it over budget); either way it is used up."""
        if cost > self._text_remaining():
            self._end_block(n, self._text_budget_error())
            return
        self._text_next = n + 1
        self.stats.text_bytes += cost
        self.text_blocks.append(text)
        if self._on_text is not None:
            self._on_text(text)
        self._reply(protocol.text_reply(n))

    def _end_block(self, n: int, error: str) -> None:
        """Refuse block ``n``; its number is used up, so later blocks are still accepted."""
        if self._partial is not None and self._partial.n == n:
            self._partial = None
        self._text_next = n + 1
        self._reply(protocol.text_reply(n, error))

    def _text_remaining(self) -> int:
        return self._limits.max_text_bytes - self.stats.text_bytes

    def _text_budget_error(self) -> str:
        return protocol.TEXT_BUDGET.format(limit=self._limits.max_text_bytes)

    def _handle_notify(self, data: dict[str, Any]) -> None:
        if not self._authentic(data) or bad_fields(protocol.NOTIFY, data):
            return  # fire-and-forget: forged or malformed notifications are dropped
        if text_budget.frame_size(data) > protocol.FRAME_CAP_BYTES:
            return  # the kernel never sends one this large: malformed, not counted
        if data["n"] in self._notify_seen:
            return  # a number already delivered: a replay, dropped
        self._notify_seen.add(data["n"])
        self._emit_notify(data["msg"])

    def _emit_notify(self, msg: str) -> None:
        """One notify() line, from the script or a tool's progress; within the notify caps."""
        if self._closed or self.stats.notifications >= protocol.NOTIFY_MAX_COUNT:
            return
        self.stats.notifications += 1
        if self._on_notify is not None:
            message = text_budget.truncate_utf8(
                text_budget.normalize_text(msg), protocol.NOTIFY_MAX_BYTES
            )
            try:
                # The spec's partial update, built once here so every consumer (the facade's
                # on_update, MCP progress, the CLI) shows the same string.
                self._on_notify(protocol.NOTIFY_UPDATE_PREFIX + message)
            except Exception:
                log.exception("on_update callback failed")

    # -- replies and teardown ------------------------------------------------------------

    def _reply(self, content: dict[str, Any]) -> None:
        if self._closed:
            return
        self._send_reply({"comm_id": self.comm_id, **content})

    def _reply_error(self, call_id: Any, error: str) -> None:
        self._reply(protocol.call_error(call_id, error))

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def aclose(self) -> None:
        """End the cell: cancel in-flight calls (withdrawing pending approvals) and wait.

        The wait is bounded: a tool that ignores cancellation is abandoned after one grace
        period (its reply is never sent) and the accounting becomes a lower bound.
        """
        self._closed = True
        self.images.close()
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
