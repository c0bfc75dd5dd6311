"""Session mode's registry: persistent kernels keyed by session, with owners, forks on reset,
strict LRU capacity and idle reaping (spec "session (opt-in)" to "Bounds and reaping").

Everything runs on the facade's event loop, so the registry needs no locks: each state change
happens between two awaits. Keys and entries are in :mod:`~lemon_exec.host.sessions.entries`;
an owner is a caller's handle (:class:`lemon_exec.session.SessionOwner`), known here by its id,
whose bindings live in :mod:`~lemon_exec.host.sessions.owners`; kernels on their way out are
counted by :mod:`~lemon_exec.host.sessions.stops`.

A call reaches the registry with its cell request already made: the registry names the cell
(``cellN.py``), adds the queue's abort, and runs it on the entry's kernel itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import time
from dataclasses import replace
from typing import Any

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import LemonExecError
from lemon_exec.host.cell import execute as cells
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.host.kernels.start_race import StartLeft, start_within
from lemon_exec.host.sessions import queue as session_queue
from lemon_exec.host.sessions.entries import Fallback, SessionKernel, SessionKey, SessionRun
from lemon_exec.host.sessions.owners import OwnerBindings
from lemon_exec.host.sessions.queue import QueueLeft, Ticket
from lemon_exec.host.sessions.stops import Stops
from lemon_exec.scope import AbortSignal
from lemon_exec.tools import ToolHost

__all__ = ["Fallback", "SessionKernel", "SessionKey", "SessionRegistry", "SessionRun"]


class SessionRegistry:
    """Key → kernel entries, owners, queues, LRU eviction and the idle reaper."""

    def __init__(self, engine: Engine, config: ExecuteCodeConfig, tool_host: ToolHost) -> None:
        self._engine = engine
        self.config = config
        self._tool_host = tool_host
        self._salt = secrets.token_bytes(16)
        self._shared: dict[SessionKey, SessionKernel] = {}
        self._bindings: OwnerBindings[SessionKey, SessionKernel] = OwnerBindings()
        self._entries: set[SessionKernel] = set()
        self._fork_counter = itertools.count(1)
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self.evicted_total = 0
        self.reaped_total = 0
        self._stops = Stops(engine)  # kernels still counted against the cap while they go

    # -- running a cell ----------------------------------------------------------------------

    async def execute(
        self,
        owner_id: int,
        key: SessionKey,
        request: cells.CellRequest,
        *,
        reset: bool,
        abort: AbortSignal | None,
        interpreter: str = "",
    ) -> SessionRun:
        """Run ``request`` on the owner's kernel for ``key``, queued behind earlier calls.

        Raises :class:`Fallback` (run it per-call), ``SessionBusyError`` (queue full),
        :class:`QueueLeft` or ``OwnerGone`` (left before it started): nothing ran.
        """
        deadline = request.deadline
        if self._closed:
            raise Fallback("registry_unavailable")
        self._ensure_reaper()
        entry = self._entry_for(owner_id, key)
        reset_performed = False
        if reset and len(entry.owners) > 1:
            entry = self._fork(owner_id, entry)
            reset_performed = True
        entry.interpreter = interpreter or key.interpreter
        queued_at = time.monotonic()
        ticket = await self._acquire(entry, owner_id, deadline, abort)
        try:
            if time.monotonic() >= deadline:
                # Granted too late: leave without running rather than start a cell that
                # would time out at once and cost the session its state.
                raise QueueLeft("timeout")
            if reset and not reset_performed:
                await self._reset(entry)
                reset_performed = True
            reused = entry.kernel is not None and await entry.kernel.is_alive()
            if entry.kernel is not None and not reused:
                entry.lost_reason = "crashed"  # it died while idle; noticed only now
            lost_reason = None if reused else entry.lost_reason
            tainted = reused and entry.tainted  # a fresh kernel holds nothing fetched
            if not reused:
                await self._start(entry, deadline, abort)
            assert entry.kernel is not None
            self._set_phase(entry, "running")
            cell = replace(
                request,
                filename=f"cell{entry.cells_run + 1}.py",
                aborts=(*request.aborts, ticket.abort),
            )
            try:
                result = await cells.run_cell(entry.kernel, cell, self._tool_host)
            except asyncio.CancelledError:
                self._discard(entry, "cancelled")  # caller death while active
                raise
            entry.cells_run += 1
            entry.last_used = time.monotonic()
            entry.tainted = result.kernel_reusable and (tainted or result.untrusted)
            if result.kernel_reusable:
                self._set_phase(entry, "idle")
            else:
                self._discard(entry, result.end)
            details: dict[str, Any] = {
                "persistent": True,
                "kernel_reused": reused,
                "reset_performed": reset_performed,
                "state_retained": result.kernel_reusable,
                "kernel_id": entry.kernel_id,
                "queue_wait_ms": int((ticket.started - queued_at) * 1000),
            }
            if entry.tainted:  # later results of this kernel are untrusted too
                details["session_tainted"] = True
            if lost_reason and not reset_performed:
                details["kernel_lost_reason"] = lost_reason
            return SessionRun(result, details, tainted)
        finally:
            self._release(entry, ticket)

    def _entry_for(self, owner_id: int, key: SessionKey) -> SessionKernel:
        entry = self._bindings.get(owner_id, key)
        if entry is not None:
            return entry
        entry = self._shared.get(key)
        if entry is None:
            entry = SessionKernel(key, key.kernel_id(self._salt, 0), 0)
            self._shared[key] = entry
            self._entries.add(entry)
        entry.owners.add(owner_id)
        self._bindings.bind(owner_id, key, entry)
        return entry

    def _fork(self, owner_id: int, shared: SessionKernel) -> SessionKernel:
        """Move one co-owner onto a fresh kernel; the others keep the shared one."""
        shared.owners.discard(owner_id)
        fork_no = next(self._fork_counter)
        entry = SessionKernel(shared.key, shared.key.kernel_id(self._salt, fork_no), fork_no)
        entry.owners.add(owner_id)
        self._entries.add(entry)
        self._bindings.bind(owner_id, shared.key, entry)
        return entry

    async def _acquire(
        self, entry: SessionKernel, owner_id: int, deadline: float, abort: AbortSignal | None
    ) -> Ticket:
        limit = self.config.max_queued_cells_per_kernel
        if len(entry.queue) >= limit and (entry.active is not None or entry.queue):
            self._engine.telemetry.emit("session.busy", {"queued": len(entry.queue)}, {})
        return await session_queue.acquire(entry, owner_id, deadline, abort, limit)

    def _release(self, entry: SessionKernel, ticket: Ticket) -> None:
        if session_queue.release(entry, ticket) and not entry.owners:
            self._stop_entry(entry, "owners_gone")

    async def _reset(self, entry: SessionKernel) -> None:
        """Discard the entry's kernel and confirm it is gone (else ``stop_failed``)."""
        kernel, entry.kernel = entry.kernel, None
        entry.lost_reason = None
        if kernel is None:
            return
        entry.phase = "stopping"
        try:
            # Shielded: a caller that dies meanwhile must not leave the stop half done.
            gone = await asyncio.shield(self._stops.retire(kernel, "reset", entry.cells_run))
        finally:
            entry.phase = "empty"
        if not gone:
            raise Fallback("stop_failed")
        entry.cells_run = 0

    async def _start(
        self, entry: SessionKernel, deadline: float, abort: AbortSignal | None
    ) -> None:
        if entry.kernel is not None:  # present but dead (crash noticed late)
            self._discard(entry, "crashed")
        await self._admit(entry, deadline, abort)
        entry.phase = "starting"  # no await since _admit's check: the slot is ours
        engine = self._engine
        settling, settled = self._stops.start_tracker()
        try:
            # The start counts against the call's deadline and abort (start_race).
            entry.kernel = await start_within(
                engine.start_kernel(
                    entry.interpreter or entry.key.interpreter, entry.key.cwd, mode="session"
                ),
                deadline,
                abort,
                spawn=engine.spawn,
                discard=self._discard_late,
                settled=settled,
            )
        except StartLeft as left:
            entry.phase = "empty"
            self._stops.count_settling(settling)
            raise QueueLeft(left.why, "start") from None
        except LemonExecError as exc:
            entry.phase = "empty"
            raise Fallback("startup_failed") from exc
        except BaseException:  # the caller went away: start_within gave the start up
            entry.phase = "empty"
            self._stops.count_settling(settling)
            raise
        entry.kernel.status.public_id = entry.kernel_id
        self._set_phase(entry, "idle")
        entry.cells_run = 0
        entry.lost_reason = None

    async def _discard_late(self, kernel: KernelHandle) -> None:
        """Stop a kernel whose start ended after its call left; it counts until gone."""
        await self._stops.retire(kernel, "discarded", 0)

    def _set_phase(self, entry: SessionKernel, phase: str) -> None:
        entry.phase = phase
        if entry.kernel is not None:
            status = entry.kernel.status
            status.phase, status.cells = phase, entry.cells_run
            status.last_used_unix = time.time()
            self._engine.touch()

    async def _admit(
        self, entry: SessionKernel, deadline: float, abort: AbortSignal | None
    ) -> None:
        """Make room under max_live_kernels (strict: stopping kernels count until gone).

        Evicts the LRU idle kernel if needed and waits, within the call's deadline, for
        kernels already being stopped to end (the 1 s grace periods bound that). Falls back
        (``capacity_exhausted``) only when nothing is evictable and nothing is stopping.
        """
        stops = self._stops
        while True:
            await stops.prune()
            live = [e for e in self._entries if e.holds_kernel and e is not entry]
            over = len(live) + len(stops) + 1 - self.config.max_live_kernels
            if over <= 0:
                return
            pending = stops.pending()
            idle = [e for e in live if e.evictable]
            if len(pending) < over and idle:  # the stops under way do not free enough
                victim = min(idle, key=lambda e: e.last_used)
                self.evicted_total += 1
                self._stop_entry(victim, "evicted", keep_entry=True)
                continue
            if not pending:  # only running work, or kernels whose stop failed
                raise Fallback("capacity_exhausted")
            await stops.wait_one(pending, deadline, abort)

    # -- stopping ----------------------------------------------------------------------------

    def _discard(self, entry: SessionKernel, why: str) -> None:
        """Throw the entry's kernel away (state unsafe); the entry remembers why."""
        self._stop_entry(
            entry, why if why in ("evicted", "reaped") else "discarded", keep_entry=True, lost=why
        )

    def _stop_entry(
        self,
        entry: SessionKernel,
        reason: str,
        *,
        keep_entry: bool = False,
        lost: str | None = None,
    ) -> None:
        kernel, entry.kernel = entry.kernel, None
        entry.phase = "empty"
        entry.lost_reason = lost or reason
        if kernel is not None:
            self._stops.retire(kernel, reason, entry.cells_run)
        entry.cells_run = 0
        if not keep_entry or not entry.owners:
            self._drop_entry(entry)

    def _drop_entry(self, entry: SessionKernel) -> None:
        self._entries.discard(entry)
        if self._shared.get(entry.key) is entry:
            del self._shared[entry.key]

    def _unbind(self, owner_id: int) -> None:
        for entry in self._bindings.pop(owner_id):
            entry.owners.discard(owner_id)
            session_queue.remove_owner(entry, owner_id)
            if entry.active is not None and entry.active.owner_id == owner_id:
                entry.active.abort.set()  # its kernel is discarded when the cell ends
            elif not entry.owners and entry.active is None:
                self._stop_entry(entry, "owners_gone")

    async def detach(self, owner_id: int) -> None:
        self._unbind(owner_id)

    def detach_soon(self, owner_id: int) -> None:
        self._unbind(owner_id)

    # -- reaping -------------------------------------------------------------------------------

    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.get_running_loop().create_task(self._reap_loop())

    async def _reap_loop(self) -> None:
        while not self._closed:
            timeout_s = self.config.kernel_idle_timeout_ms / 1000
            await asyncio.sleep(max(0.05, min(timeout_s / 4, 30.0)))
            self.reap_idle()
            self._stops.retry_stuck()

    def reap_idle(self, now: float | None = None) -> int:
        """Stop kernels idle for longer than kernel_idle_timeout_ms; running work never."""
        now = time.monotonic() if now is None else now
        timeout_s = self.config.kernel_idle_timeout_ms / 1000
        reaped = 0
        for entry in list(self._entries):
            if entry.evictable and now - entry.last_used > timeout_s:
                self.reaped_total += 1
                reaped += 1
                self._stop_entry(entry, "reaped", keep_entry=True)
        return reaped

    def snapshot(self) -> dict[str, Any]:
        """Aggregate counts only: no keys, ids, paths or PIDs."""
        phases: dict[str, int] = {p: 0 for p in ("starting", "idle", "running")}
        for entry in self._entries:
            if entry.phase in phases:
                phases[entry.phase] += 1
        # Kernels being stopped (timeout, crash, eviction, reaping, reset, owners gone) until
        # their process is confirmed gone; they count against the cap with ``live``.
        phases["stopping"] = len(self._stops)
        return {
            "live": sum(1 for e in self._entries if e.holds_kernel),
            "capacity": self.config.max_live_kernels,
            "phases": phases,
            "owners": len(self._bindings),
            "forks": sum(1 for e in self._entries if e.fork and e.holds_kernel),
            "queued": sum(len(e.queue) for e in self._entries),
            "evicted_total": self.evicted_total,
            "reaped_total": self.reaped_total,
            "idle_timeout_ms": self.config.kernel_idle_timeout_ms,
            "max_queued_cells_per_kernel": self.config.max_queued_cells_per_kernel,
        }

    async def aclose(self) -> None:
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reaper
        for entry in list(self._entries):
            active = entry.active is not None
            session_queue.close(entry)  # the active cell's kernel is discarded as it ends
            if not active:
                self._stop_entry(entry, "closed")
