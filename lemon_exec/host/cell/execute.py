"""Run one script cell on a kernel (a backend's KernelHandle), end to end, and say how it ended.

Output, text blocks, notifications and helper calls are all handled as they arrive (the
kernel's IOPub reader calls :class:`_CellSink`), while a watchdog waits for the end: the
execute reply *and* IOPub idle, the deadline, an abort, or the kernel's death (polled, so a
dead kernel is noticed within about 100 ms and never waited on), or a protocol fault (a
message that failed its signature check or was malformed: the cell ends at once, and the
kernel is not trusted again).

The deadline does not wait for output to drain: the kernel's readers yield to the event loop
after every message, and after a timeout or abort the cell is reported at most
:data:`_REPORT_WITHIN_S` later, whatever is still queued (the kernel is discarded anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from lemon_exec._constants import GRACE_S
from lemon_exec.host.cell.host_bridge import BridgeLimits, BridgeStats, HostBridge
from lemon_exec.host.cell.image_frames import ImageStats
from lemon_exec.host.cell.output import DEFAULT_MAX_SPILL_BYTES, CapturedOutput, OutputCapture
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.images import ImageBlock
from lemon_exec.scope import AbortSignal  # public: defined where callers import it
from lemon_exec.tools import ToolHost
from lemon_exec.tools._toolset import ToolSet
from lemon_exec.wire import cell_setup, script_outcome

log = logging.getLogger(__name__)

_WATCHDOG_S = 0.1
#: After the kernel died, how long to wait for messages it sent just before.
_DEATH_DRAIN_S = 0.05
#: After a timeout or abort, the result is reported at most this long later. Within it the
#: interrupted script may still flush partial output and text blocks; the kernel's own
#: SIGINT -> SIGTERM -> SIGKILL escalation (GRACE_S each) goes on in the background.
_REPORT_WITHIN_S = 0.5
#: When a channel lost messages, the execute reply (or IOPub idle) may never come: the cell
#: counts as finished this long after the other of the two arrived.
_GAP_SETTLE_S = 0.2

#: How a cell ended. ok, exit and exception leave the kernel's state intact.
CellEnd = Literal["ok", "exit", "exception", "timeout", "cancelled", "crashed", "protocol_fault"]


@dataclass
class CellRequest:
    code: str
    deadline: float  # time.monotonic() by which the cell must have ended
    helpers: tuple[str, ...]
    limits: BridgeLimits
    max_output_bytes: int
    spill_dir: Path
    cwd: Path
    filename: str = "script.py"
    max_spill_bytes: int = DEFAULT_MAX_SPILL_BYTES
    chdir: bool = False  # per-call claims move the kernel to cwd; sessions start there
    env: dict[str, str] | None = None
    aborts: tuple[AbortSignal, ...] = ()
    on_update: Callable[[str], None] | None = None
    on_output: Callable[[str], None] | None = None  # each chunk of output, as it arrives
    on_text: Callable[[str], None] | None = None  # each text() block, once accepted
    on_start: Callable[[], None] | None = None  # called as the script is sent to the kernel
    argv: tuple[str, ...] | None = None
    toolset: ToolSet | None = None  # registered tools beyond the five (code mode)


@dataclass
class CellResult:
    """How a cell ended; for a protocol fault ``fault`` says what was wrong."""

    end: CellEnd
    output: CapturedOutput
    text_blocks: list[str]
    stats: BridgeStats
    exit_code: int | None = None
    ename: str = ""
    evalue: str = ""
    duration_ms: int = 0
    fault: str | None = None
    #: The memory limit (MiB) whose OOM kill ended the kernel ("crashed" only), else None.
    memory_limit_mb: int | None = None
    #: Output of earlier cells' threads and children that the kernel dropped (its reply).
    late_output_bytes: int = 0
    #: The images the script showed, in order, and their accounting.
    images: list[ImageBlock] = field(default_factory=list)
    image_stats: ImageStats = field(default_factory=ImageStats)

    @property
    def kernel_reusable(self) -> bool:
        """Whether the kernel's state survives (the spec's state-retention table)."""
        return self.end in ("ok", "exit", "exception")

    @property
    def untrusted(self) -> bool:
        """Whether the cell's own output may hold third-party text (it fetched, or may have)."""
        return "webfetch" in self.stats.tools or self.stats.accounting_loss


class _CellSink:
    """Receives the cell's IOPub messages and its execute reply."""

    def __init__(
        self,
        capture: OutputCapture,
        bridge: HostBridge,
        on_output: Callable[[str], None] | None = None,
    ) -> None:
        self.capture = capture
        self.on_output = on_output
        self.bridge = bridge
        self.reply: dict[str, Any] | None = None
        self.idle = False
        self.done = asyncio.get_running_loop().create_future()
        self.fault: str | None = None  # the first protocol fault while the cell ran
        self._gaps: set[str] = set()  # channels that lost messages during this cell
        self._settle: asyncio.TimerHandle | None = None

    def on_iopub(self, msg: dict[str, Any]) -> None:
        msg_type = msg.get("msg_type")
        content = msg.get("content") or {}
        if msg_type == "stream":
            self._output(str(content.get("text", "")))
        elif msg_type == "comm_msg":
            if content.get("comm_id") == self.bridge.comm_id:
                self.bridge.handle(content.get("data"), msg.get("buffers") or ())
        elif msg_type in ("display_data", "execute_result"):
            plain = (content.get("data") or {}).get("text/plain")
            if isinstance(plain, str):
                self._output(plain + "\n")
        elif msg_type == "status" and content.get("execution_state") == "idle":
            self.idle = True
            self._check_done()

    def _output(self, text: str) -> None:
        self.capture.write(text)
        if self.on_output is not None:
            try:
                self.on_output(text)
            except Exception:  # a consumer's bug must not cost the cell its output
                log.exception("on_output callback failed")

    def on_reply(self, msg: dict[str, Any]) -> None:
        if msg.get("msg_type") == "execute_reply":
            self.reply = msg.get("content") or {}
            self._check_done()

    def on_dropped(self, channel: str, note: str) -> None:
        self.capture.add_note(note)
        self._gaps.add(channel)
        self._check_done()

    def on_protocol_fault(self, channel: str, reason: str) -> None:
        # One invalid message is enough: nothing the kernel says can be trusted any more.
        if self.fault is None:
            self.fault = reason
        self._finish()

    def _check_done(self) -> None:
        if self.done.done():
            return
        if self.reply is not None and self.idle:
            self.done.set_result(None)
        elif self._settle is None and (
            (self.reply is not None and "IOPub" in self._gaps)
            or (self.idle and "shell" in self._gaps)
        ):
            # The missing half may have been lost with the dropped message: don't wait for
            # it until the deadline. Output sent after the reply normally lands well within.
            self._settle = asyncio.get_running_loop().call_later(_GAP_SETTLE_S, self._finish)

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def close(self) -> None:
        if self._settle is not None:
            self._settle.cancel()


async def run_cell(kernel: KernelHandle, request: CellRequest, tool_host: ToolHost) -> CellResult:
    """Run ``request.code`` on ``kernel``. Never raises for script failures; never hangs."""
    started = time.monotonic()
    capture = OutputCapture(
        request.max_output_bytes, request.spill_dir, max_spill_bytes=request.max_spill_bytes
    )
    toolset = request.toolset
    digest, specs = (None, None) if toolset is None else toolset.setup_for(kernel)
    bridge = HostBridge(
        tool_host=tool_host,
        enabled_tools=request.helpers + (toolset.names if toolset is not None else ()),
        cwd=request.cwd,
        limits=request.limits,
        send_reply=kernel.send_bridge_reply,
        on_notify=request.on_update,
        on_text=request.on_text,
        spill_dir=request.spill_dir,
    )
    sink = _CellSink(capture, bridge, request.on_output)
    metadata = cell_setup.cell_metadata(
        cell_setup.CellSetup(
            token=bridge.token,
            comm_id=bridge.comm_id,
            helpers=request.helpers,
            max_text_bytes=request.limits.max_text_bytes,
            max_images=request.limits.max_images,
            max_image_bytes=request.limits.max_image_bytes,
            filename=request.filename,
            argv=request.argv,
            cwd=str(request.cwd) if request.chdir else None,
            env=request.env,
            tools_digest=digest,
            tools=tuple(specs) if specs is not None else None,
        )
    )
    if request.on_start is not None:
        request.on_start()
    # A kernel that already broke the protocol (while idle) never runs another cell.
    msg_id = None if kernel.fault else kernel.execute(request.code, metadata, sink)
    if msg_id is None and toolset is not None:
        toolset.forget(kernel)  # the specs never reached it
    end: CellEnd = "ok"
    try:
        end = "protocol_fault" if msg_id is None else await _watch(kernel, sink, request)
        if end in ("timeout", "cancelled"):
            await _interrupt(kernel, sink)
    except asyncio.CancelledError:
        # The caller died: treat it as an abort, but still interrupt before unwinding.
        with contextlib.suppress(BaseException):
            await _interrupt(kernel, sink)
        raise
    finally:
        sink.close()
        if msg_id is not None:
            kernel.release(msg_id)
        await bridge.aclose()
        output = capture.finish()
    result = CellResult(
        end=end,
        output=output,
        text_blocks=list(bridge.text_blocks),
        stats=bridge.stats,
        images=list(bridge.images.blocks),
        image_stats=bridge.images.stats,
        duration_ms=int((time.monotonic() - started) * 1000),
    )
    if end == "ok" and kernel.fault:  # the cell's own messages were fine, a stray one was not
        end = result.end = "protocol_fault"
    if end == "protocol_fault":
        result.fault = sink.fault or kernel.fault
    elif end == "ok":
        _apply_reply(result, sink.reply or {})
    elif end == "crashed":
        result.exit_code = await kernel.exit_status()
        if kernel.cgroup is not None and kernel.cgroup.memory_limit_hit():
            result.memory_limit_mb = kernel.cgroup.memory_mb
    return result


async def _watch(kernel: KernelHandle, sink: _CellSink, request: CellRequest) -> CellEnd:
    # asyncio.Events are awaited; threading.Events are polled by the watchdog tick.
    abort_waits = [
        asyncio.ensure_future(a.wait()) for a in request.aborts if isinstance(a, asyncio.Event)
    ]
    try:
        while True:
            remaining = request.deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            await asyncio.wait(
                {sink.done, *abort_waits},
                timeout=min(_WATCHDOG_S, remaining),
                return_when=asyncio.FIRST_COMPLETED,
            )
            if sink.done.done():
                return _ended(sink)
            if any(a.is_set() for a in request.aborts):
                return "cancelled"
            if not await kernel.is_alive():
                await asyncio.sleep(_DEATH_DRAIN_S)  # let messages sent just before arrive
                return _ended(sink) if sink.done.done() else "crashed"
    finally:
        for waiter in abort_waits:
            waiter.cancel()


def _ended(sink: _CellSink) -> CellEnd:
    return "ok" if sink.fault is None else "protocol_fault"


async def _interrupt(kernel: KernelHandle, sink: _CellSink) -> None:
    """SIGINT the process group and give the cell a short while to flush and finish.

    The kernel is discarded afterwards either way (the caller escalates to SIGTERM and
    SIGKILL); the wait is what lets partial output and text blocks arrive. It is shorter
    than the spec's GRACE_S so the caller hears of the timeout promptly; stopping the kernel
    (:func:`lemon_exec.host.kernels.backend.dispose`) still gives it the rest of that grace
    period before SIGTERM, in the background.
    """
    if kernel.disposed:  # killed already (e.g. the host is closing): nothing more comes
        return
    kernel.interrupted_at = time.monotonic()
    await kernel.signal_group(signal.SIGINT)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(sink.done), min(GRACE_S, _REPORT_WITHIN_S))


def _apply_reply(result: CellResult, reply: dict[str, Any]) -> None:
    outcome = script_outcome.parse_script_reply(reply)
    result.end = _REPLY_ENDS.get(outcome.kind, "exception")
    result.exit_code = outcome.exit_code
    result.ename, result.evalue = outcome.ename, outcome.evalue
    result.late_output_bytes = outcome.late_output_bytes


_REPLY_ENDS: dict[str, CellEnd] = {"ok": "ok", "exit": "exit", "exception": "exception"}
