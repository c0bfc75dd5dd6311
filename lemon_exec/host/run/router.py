"""The modes: per-call and session runs side by side, over one kernel supervisor.

:class:`Modes` owns what the two modes need of their own (the warm spares and per-call
admission; the session registry and its owners) and asks the :class:`Engine` for kernels;
the engine asks its backend. Ownership flows one way: facade → modes → engine → backend
and kernel. Owners (:class:`lemon_exec.session.SessionOwner`) hold the modes, never the
facade; both reach a run through :meth:`Modes.run` or :meth:`Modes.run_call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import (
    InterpreterError,
    KernelStartError,
    LemonExecError,
    RefusedError,
    SessionBusyError,
)
from lemon_exec.host.cell import execute as cells
from lemon_exec.host.cell.host_bridge import BridgeLimits
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.kernels.engine import Engine, StagingStartError, StartTimeout
from lemon_exec.host.kernels.start_race import StartLeft, start_within
from lemon_exec.host.percall.admission import Admission, Denied, Slot, default_limit
from lemon_exec.host.percall.pool import KernelPool
from lemon_exec.host.run.calls import Call, CallArgs, prepare
from lemon_exec.host.run.results import (
    build_result,
    fallback_failed_note,
    fallback_note,
    left_queue,
    lost_line,
    refusal,
)
from lemon_exec.host.sessions.owners import detach_when_collected, new_owner_id
from lemon_exec.host.sessions.queue import OwnerGone, QueueLeft
from lemon_exec.host.sessions.registry import Fallback, SessionKey, SessionRegistry
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.scope import SessionScope
from lemon_exec.session import SessionOwner
from lemon_exec.telemetry import Telemetry, stop_event
from lemon_exec.tools import ToolHost
from lemon_exec.tools._toolset import toolset

#: A spare's warm-up cell: it writes to both output streams, whose first use costs most in a
#: sandboxed kernel (~6 ms), and binds no name.
_WARM_CELL = "print(end=' ', flush=True)\n__import__('sys').stderr.write(' ')"
#: A spare's empty warm-up cell must finish within this many seconds.
_WARM_CELL_TIMEOUT_S = 10.0
#: Sandboxed spares are kept for this many working directories (the most recently used).
_SANDBOXED_SPARE_DIRS = 4

OWNER_CLOSED_WHILE_QUEUED = (
    "execute_code: the session owner was closed while this call was queued; nothing ran"
)
SHUTTING_DOWN = "execute_code: the tool is shutting down; nothing ran."


class Modes:
    """Runs validated calls per-call or in a session; owns the pool and the registry."""

    def __init__(
        self,
        config: ExecuteCodeConfig,
        tool_host: ToolHost,
        telemetry: Telemetry,
        staging_base: Path | None = None,
    ) -> None:
        self.config = config
        self.tool_host = tool_host
        self.telemetry = telemetry
        self.loop = asyncio.get_running_loop()
        self.engine = Engine(config, telemetry, staging_base)  # RefusedError: no staging root
        self.pool = KernelPool(
            self._start_cold,
            config.warm_kernels,
            start_spare=self._start_spare,
            discard=self._discard_spare,
            max_keys=_SANDBOXED_SPARE_DIRS if self.engine.backend.sandboxed else None,
        )
        self.admission = Admission(
            config.max_concurrent_per_call or default_limit(), config.max_queued_per_call
        )
        self.sessions = SessionRegistry(self.engine, config, self._run_cell)
        #: The owner ``run(scope=...)`` uses when the caller did not ``attach`` one.
        self._default_owners: dict[SessionScope, SessionOwner] = {}
        self.closed = False

    # -- entry points ----------------------------------------------------------------------------

    async def run(self, args: CallArgs, *, owner_id: int | None = None) -> ExecuteCodeResult:
        """Validate ``args`` and run them (a session owner's way in); telemetry included."""
        entered = time.monotonic()
        call = prepare(self.config, args, entered)
        if isinstance(call, Call):
            self.check_usable()
            result = await self.run_call(call, owner_id=owner_id)
        else:
            result = call
        return finish(result, entered, self.telemetry)

    def check_usable(self) -> None:
        """Raise ``RuntimeError`` when closed or called from another event loop."""
        if self.closed:
            raise RuntimeError("this ExecuteCode facade is closed")
        if asyncio.get_running_loop() is not self.loop:
            raise RuntimeError(
                "an ExecuteCode facade is bound to the event loop it was first used on; "
                "create one facade per loop (or use run_sync from threads)"
            )

    async def run_call(self, call: Call, *, owner_id: int | None = None) -> ExecuteCodeResult:
        """Run a validated call in the configured mode."""
        try:
            self.engine.ensure_staging()  # a script may have deleted it: made again, or refused
        except RefusedError as exc:
            return staging_refused(exc, call.details, self.config.mode, self.telemetry)
        if self.config.mode == "session":
            return await self.run_in_session(call, owner_id)
        return await self.run_per_call(call)

    def attach(self, scope: SessionScope) -> SessionOwner:
        """A new owner handle for ``scope`` (co-ownership; see docs/modes.md)."""
        owner = SessionOwner(self, scope, new_owner_id())
        detach_when_collected(owner, self.sessions, owner.owner_id)
        return owner

    async def detach(self, owner_id: int) -> None:
        await self.sessions.detach(owner_id)

    def detach_soon(self, owner_id: int) -> None:
        self.sessions.detach_soon(owner_id)

    def warm_up(self, interpreter: str) -> None:
        """Start the fork server, and per-call spares, for ``interpreter`` in the background."""
        self.engine.warm_up(interpreter)
        if self.config.mode != "session":
            self.pool.refill(self._spare_key(interpreter, Path.cwd()))

    def snapshot(self) -> dict[str, Any]:
        """Aggregate kernel counts (no identities): the session registry plus spares."""
        counts = self.sessions.snapshot()
        counts["spares"] = self.pool.spare_count
        counts["kernels_total"] = self.engine.live_kernels
        return counts

    async def aclose(self) -> None:
        """Stop spares, sessions and every kernel; wait for background stops; remove files."""
        if self.closed:
            return
        self.closed = True
        self.engine.refuse_starts()
        self.admission.close()
        with contextlib.suppress(Exception):
            await self.sessions.aclose()
        await self.pool.aclose()
        await self.engine.aclose()

    # -- per-call ------------------------------------------------------------------------------

    async def run_per_call(self, call: Call, notes: list[str] | None = None) -> ExecuteCodeResult:
        """One script in a fresh kernel and a fresh private workspace, both gone afterwards.

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
            try:
                workspace = engine.staging.new_workspace(call.script)
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
                try:
                    result = await self._run_cell(kernel, self.call_request(call, chdir=True))
                finally:
                    # A used kernel is never reused: stopped in the background, off the hot
                    # path. Its slot is freed once it is gone, so the cap bounds live kernels.
                    engine.spawn(self._stop_and_release(kernel, slot))
                    self.pool.refill(key)
            finally:
                engine.staging.remove_workspace(workspace)
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
        # One empty script cell pays the first-cell costs (lazy imports, and in a forked
        # kernel the copy-on-write faults: ~8 ms) before a caller waits. It defines nothing,
        # so the namespace a run finds is still fresh.
        warm = self.cell_request(
            _WARM_CELL,
            cwd=engine.staging.work_dir,
            deadline=time.monotonic() + _WARM_CELL_TIMEOUT_S,
            chdir=False,
            aborts=(),
            on_update=None,
        )
        try:
            result = await self._run_cell(kernel, warm)
        except BaseException:
            await engine.stop(kernel, reason="discarded", mode="per_call", cells_run=0)
            raise
        if result.end != "ok":
            await engine.stop(kernel, reason="discarded", mode="per_call", cells_run=0)
            raise KernelStartError("execute_code: a spare kernel failed its warm-up cell")
        return kernel

    def _discard_spare(self, kernel: KernelHandle) -> None:
        self.engine.discard(kernel, reason="stale_env", mode="per_call", cells_run=0)

    # -- session -------------------------------------------------------------------------------

    async def run_in_session(self, call: Call, owner_id: int | None) -> ExecuteCodeResult:
        """Run one call in session mode, falling back to per-call only before code starts."""
        details = {**call.details, "mode": "session"}
        scope = call.scope
        reason: str | None = None
        if scope is None or not scope.complete:
            reason = "missing_session_scope"
        else:
            key = SessionKey.build(scope, call.cwd, call.interpreter, self.config.enabled_helpers)
            if owner_id is None:
                owner_id = self._default_owner(scope, key).owner_id
            session_call = replace(call, cwd=Path(key.cwd))

            def request_for(filename: str) -> cells.CellRequest:
                return self.call_request(session_call, chdir=False, filename=filename)

            try:
                run = await self.sessions.execute(
                    owner_id,
                    key,
                    request_for,
                    reset=call.reset,
                    deadline=call.deadline,
                    abort=call.abort,
                    interpreter=call.interpreter,
                )
            except Fallback as fb:
                reason = fb.reason
            except SessionBusyError as exc:
                busy = {**details, "persistent": True, "state_retained": True, "busy": True}
                return refusal(str(exc), busy)
            except QueueLeft as left:
                return left_queue(left.why, left.where, call.timeout_ms, details)
            except OwnerGone:
                # The spec's "caller death" row: state_retained false, though nothing ran.
                gone = {**details, "persistent": True, "state_retained": False}
                return refusal(OWNER_CLOSED_WHILE_QUEUED, {**gone, "never_started": True})
            else:
                lost = run.details.get("kernel_lost_reason")
                return build_result(
                    run.cell,
                    timeout_ms=call.timeout_ms,
                    details={**details, **run.details},
                    tainted=run.tainted,
                    lead=lost_line(lost) if lost else None,
                )
        self.telemetry.emit("session.fallback", {}, {"reason": reason})
        fallback = {
            **details,
            "persistent": False,
            "fallback_reason": reason,
            "kernel_reused": False,
        }
        return await self.run_per_call(
            replace(call, details=fallback), notes=[fallback_note(reason)]
        )

    def _default_owner(self, scope: SessionScope, key: SessionKey) -> SessionOwner:
        """The modes' own owner for ``scope`` (``run(scope=...)`` without ``attach``).

        Keyed by the canonical directory (the session key's), so ``/d``, ``/d/``, ``./d``, a
        symlink to it and ``/d/x/..`` are one owner: otherwise each spelling would co-own
        the one kernel, and a reset through one would fork instead of resetting it.
        """
        canonical = SessionScope(scope.session_id, scope.agent_id, key.cwd)
        owner = self._default_owners.get(canonical)
        if owner is None or owner.closed:
            owner = self.attach(canonical)
            self._default_owners[canonical] = owner
        return owner

    # -- cells ---------------------------------------------------------------------------------

    async def _run_cell(self, kernel: KernelHandle, request: cells.CellRequest) -> cells.CellResult:
        return await cells.run_cell(kernel, request, self.tool_host)

    def limits(self) -> BridgeLimits:
        c = self.config
        return BridgeLimits(
            max_calls=c.max_rpc_calls,
            max_result_bytes=c.max_rpc_result_bytes,
            max_text_bytes=c.max_text_bytes,
            max_parallel=c.max_parallel_rpc,
            max_parallel_mcp=c.max_parallel_mcp,
        )

    def cell_request(
        self,
        script: str,
        *,
        cwd: Path,
        deadline: float,
        chdir: bool,
        aborts: tuple[Any, ...],
        on_update: Callable[[str], None] | None,
        filename: str = "script.py",
        on_output: Callable[[str], None] | None = None,
        argv: tuple[str, ...] | None = None,
    ) -> cells.CellRequest:
        return cells.CellRequest(
            code=script,
            deadline=deadline,
            helpers=self.config.enabled_helpers,
            toolset=toolset(self.tool_host.registry, self.config.tools),
            limits=self.limits(),
            max_output_bytes=self.config.max_output_bytes,
            max_spill_bytes=self.config.max_spill_bytes,
            spill_dir=self.engine.staging.spill_dir,
            cwd=cwd,
            filename=filename,
            chdir=chdir,
            aborts=aborts,
            on_update=on_update,
            on_output=on_output,
            argv=argv,
        )

    def call_request(
        self, call: Call, *, chdir: bool, filename: str | None = None
    ) -> cells.CellRequest:
        """The cell request for ``call``; ``filename`` overrides the call's own."""
        return self.cell_request(
            call.script,
            cwd=call.cwd,
            deadline=call.deadline,
            chdir=chdir,
            aborts=(call.abort,) if call.abort is not None else (),
            on_update=call.on_update,
            filename=filename or call.filename,
            on_output=call.on_output,
            argv=call.argv,
        )


def finish(result: ExecuteCodeResult, entered: float, telemetry: Telemetry) -> ExecuteCodeResult:
    """Stamp the call's duration and emit its ``execute_code.stop`` event."""
    result.details["duration_ms"] = int((time.monotonic() - entered) * 1000)
    telemetry.emit(*stop_event(result))
    return result


def staging_refused(
    exc: RefusedError, details: dict[str, Any], mode: str, telemetry: Telemetry
) -> ExecuteCodeResult:
    """The refusal when the private staging root could not be made (fail closed)."""
    if mode == "session":  # the spec's pre-start fallback, which cannot stage either
        details = {**details, "fallback_reason": "startup_failed", "kernel_reused": False}
        telemetry.emit("session.fallback", {}, {"reason": "startup_failed"})
    return workspace_refused(exc, details)


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


__all__ = ["Modes", "finish", "staging_refused", "start_failure", "workspace_refused"]
