"""Per-call runs: one script in a fresh kernel and a fresh private workspace, both gone after.

A run takes one of the admission slots (:mod:`~lemon_exec.host.percall.admission`), claims a
warm spare from the pool (:mod:`~lemon_exec.host.percall.pool`) or starts a kernel cold, runs
the cell and has the used kernel stopped in the background. The pool asks this module to start
its spares (:meth:`PerCallRuns._start_spare`): a spare pays its first-cell costs with an empty
warm-up cell before any caller waits on it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import InterpreterError, KernelStartError, LemonExecError, RefusedError
from lemon_exec.host.cell import execute as cells
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.kernels.engine import Engine, StagingStartError, StartTimeout
from lemon_exec.host.kernels.start_race import StartLeft, start_within
from lemon_exec.host.percall.admission import Admission, Denied, Slot, default_limit
from lemon_exec.host.percall.pool import KernelPool
from lemon_exec.host.run.calls import Call
from lemon_exec.host.run.requests import CellRequests
from lemon_exec.host.run.results import build_result, fallback_failed_note, left_queue, refusal
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.tools import ToolHost

#: A spare's warm-up cell: it writes to both output streams, whose first use costs most in a
#: sandboxed kernel (~6 ms), and binds no name.
_WARM_CELL = "print(end=' ', flush=True)\n__import__('sys').stderr.write(' ')"
#: A spare's empty warm-up cell must finish within this many seconds.
_WARM_CELL_TIMEOUT_S = 10.0
#: Sandboxed spares are kept for this many working directories (the most recently used).
_SANDBOXED_SPARE_DIRS = 4

SHUTTING_DOWN = "execute_code: the tool is shutting down; nothing ran."


class PerCallRuns:
    """Runs calls per-call; owns the warm spares and per-call admission."""

    def __init__(
        self,
        config: ExecuteCodeConfig,
        engine: Engine,
        tool_host: ToolHost,
        requests: CellRequests,
    ) -> None:
        self.config = config
        self.engine = engine
        self.tool_host = tool_host
        self.requests = requests
        self.pool = KernelPool(
            self._start_cold,
            config.warm_kernels,
            start_spare=self._start_spare,
            discard=self._discard_spare,
            max_keys=_SANDBOXED_SPARE_DIRS if engine.backend.sandboxed else None,
        )
        self.admission = Admission(
            config.max_concurrent_per_call or default_limit(), config.max_queued_per_call
        )

    def warm_up(self, interpreter: str) -> None:
        """Start this interpreter's spares in the background."""
        self.pool.refill(self._spare_key(interpreter, Path.cwd()))

    async def run(self, call: Call, notes: list[str] | None = None) -> ExecuteCodeResult:
        """Run ``call`` in a fresh kernel; ``notes`` come first in its result.

        The run first takes one of the admission slots (waiting in the bounded queue, on the
        call's own deadline); the slot is held until its kernel is confirmed stopped.
        """
        slot = await self.admission.acquire(call.deadline, call.abort)
        if isinstance(slot, Denied):
            return self._denied(slot, call)
        engine = self.engine
        kernel: KernelHandle | None = None
        released = False
        details = {**call.details, "queue_wait_ms": slot.waited_ms}
        try:
            try:  # on the disk worker: a slow disk stalls this run, not the event loop
                workspace = await engine.disk.call(engine.staging.new_workspace, call.script)
            except RefusedError as exc:  # e.g. a full disk: nothing ran, nothing is left
                return workspace_refused(exc, details)
            try:
                key = self._spare_key(call.interpreter, call.cwd)
                try:
                    # The replacement spare starts after the run (refill below), not during it.
                    # The start counts against the call's deadline and abort: past either,
                    # the call leaves at once and the slot is freed once the start is undone.
                    claimed = await start_within(
                        self.pool.claim(key, defer=True),
                        call.deadline,
                        call.abort,
                        spawn=engine.spawn,
                        discard=self._discard_claimed,
                        settled=slot.release,
                    )
                    kernel, source = claimed
                except StartLeft as left:
                    released = True  # by the abandoned start, once it has settled
                    return left_queue(left.why, "start", call.timeout_ms, details, session=False)
                except KernelStartError as exc:
                    return start_failure(exc, details)
                except LemonExecError as exc:
                    return refusal(str(exc), details)
                kernel.status.phase = "running"
                engine.touch()
                request = self.requests.for_call(call, chdir=True)
                try:
                    result = await cells.run_cell(kernel, request, self.tool_host)
                finally:
                    # A used kernel is never reused: stopped in the background, off the hot
                    # path. Its slot is freed once it is gone, so the cap bounds live kernels.
                    engine.spawn(self._stop_and_release(kernel, slot))
                    self.pool.refill(key)
            finally:
                # Gone before the result is returned: no file outlives its run. A bare one
                # (its script alone) here; what a run left there, on the disk worker.
                if not engine.staging.remove_bare_workspace(workspace):
                    await engine.disk.settle(engine.staging.remove_workspace, workspace)
        finally:
            if kernel is None and not released:  # no kernel to wait for: the slot is free
                slot.release()
        details["kernel_source"] = source
        return build_result(result, timeout_ms=call.timeout_ms, details=details, notes=notes)

    async def _discard_claimed(self, claimed: tuple[KernelHandle, str]) -> None:
        """Stop a kernel claimed too late for its call (the deadline passed meanwhile)."""
        await self.engine.stop(claimed[0], reason="discarded", mode="per_call", cells_run=0)

    async def _stop_and_release(self, kernel: KernelHandle, slot: Slot) -> None:
        try:
            await self.engine.stop(kernel, reason="finished", mode="per_call")
        finally:
            slot.release()

    def _denied(self, denied: Denied, call: Call) -> ExecuteCodeResult:
        """The busy (or cancelled) answer for a call that got no per-call slot."""
        limit = self.admission.limit
        details = {
            **call.details,
            "busy": denied.reason in ("queue_full", "queue_timeout"),
            "busy_reason": denied.reason,
            "queue_wait_ms": denied.waited_ms,
            "per_call_running": denied.running,
            "per_call_waiting": denied.waiting,
            "max_concurrent_per_call": limit,
        }
        if denied.reason == "cancelled":
            message = (
                "Script cancelled.\n\nIt was still waiting for a free per-call slot; nothing ran."
            )
            return refusal(message, {**details, "cancelled": True})
        if denied.reason == "closed":
            return refusal(SHUTTING_DOWN, details)
        if denied.reason == "queue_timeout":
            message = (
                f"execute_code is busy: this call waited {denied.waited_ms} ms for one of the "
                f"{limit} per-call slots until its timeout ran out ({denied.running} runs "
                f"running, {denied.waiting} waiting); nothing ran; try again shortly."
            )
        else:
            message = (
                f"execute_code is busy: {denied.running} per-call runs already running and "
                f"{denied.waiting} waiting; try again shortly."
            )
        return refusal(message, details)

    # -- spares --------------------------------------------------------------------------------

    def _spare_key(self, interpreter: str, cwd: Path | str) -> str:
        """The pool key of a per-call kernel: a sandboxed kernel's view of the filesystem is
        fixed when it starts, so its spares are kept per working directory too."""
        if not self.engine.backend.sandboxed:
            return interpreter
        return f"{interpreter}\0{os.path.realpath(cwd)}"

    def _start_dir(self, key: str) -> tuple[str, str]:
        """``(interpreter, directory to start in)`` for a pool key (see :meth:`_spare_key`)."""
        interpreter, _, view = key.partition("\0")
        return interpreter, view or str(self.engine.staging.work_dir)

    async def _start_cold(self, key: str) -> KernelHandle:
        interpreter, start_dir = self._start_dir(key)
        return await self.engine.start_kernel(interpreter, start_dir, mode="per_call")

    async def _start_spare(self, key: str) -> KernelHandle:
        engine = self.engine
        interpreter, start_dir = self._start_dir(key)
        kernel = await engine.start_kernel(interpreter, start_dir, mode="per_call", source="spare")
        if engine.closing:  # the pool's cancel was lost on the way (asyncio on 3.11 can)
            await engine.stop(kernel, reason="discarded", mode="per_call", cells_run=0)
            raise asyncio.CancelledError
        # One empty script cell pays the first-cell costs (lazy imports, and in a forked
        # kernel the copy-on-write faults: ~8 ms) before a caller waits. It defines nothing,
        # so the namespace a run finds is still fresh.
        warm = self.requests.for_script(
            _WARM_CELL,
            cwd=engine.staging.work_dir,
            deadline=time.monotonic() + _WARM_CELL_TIMEOUT_S,
            chdir=False,
            aborts=(),
            on_update=None,
        )
        cell = asyncio.ensure_future(cells.run_cell(kernel, warm, self.tool_host))
        try:
            result = await asyncio.shield(cell)
        except BaseException:
            # Given up (the pool closes): nobody reads a warm-up cell's output, so the kernel
            # goes first and the cell then ends without waiting for it to flush.
            await engine.stop(kernel, reason="discarded", mode="per_call", cells_run=0)
            cell.cancel()
            await asyncio.gather(cell, return_exceptions=True)
            raise
        if result.end != "ok":
            await engine.stop(kernel, reason="discarded", mode="per_call", cells_run=0)
            raise KernelStartError("execute_code: a spare kernel failed its warm-up cell")
        return kernel

    def _discard_spare(self, kernel: KernelHandle) -> None:
        self.engine.discard(kernel, reason="stale_env", mode="per_call", cells_run=0)


def workspace_refused(exc: RefusedError, details: dict[str, Any]) -> ExecuteCodeResult:
    """A run refused because its private workspace could not be made: nothing ran.

    A session call's isolated fallback that fails so says first that it was a fallback, and
    carries the ``startup_failed`` keys, as the spec's startup_failed fallback does.
    """
    reason = details.get("fallback_reason")
    if reason is None:
        return refusal(str(exc), details)
    details = {**details, "startup_failed": True, "startup_error": "staging"}
    return refusal(f"{fallback_failed_note(reason)}\n\n{exc}", details)


def start_failure(exc: KernelStartError, details: dict[str, Any]) -> ExecuteCodeResult:
    """The result of a run whose kernel could not start: nothing ran; the reason is kept."""
    if isinstance(exc, InterpreterError):
        kind = "interpreter"
    elif isinstance(exc, StartTimeout):
        kind = "timeout"
    elif isinstance(exc, StagingStartError):
        kind = "staging"
    else:
        kind = "failed"
    message = str(exc)
    reason = details.get("fallback_reason")
    if reason is not None:  # a session call's isolated fallback: say that it was one
        message = f"{fallback_failed_note(reason)}\n\n{message}"
    return refusal(message, {**details, "startup_failed": True, "startup_error": kind})
