"""Session mode's registry: persistent kernels keyed by session, with owners, forks on reset,
strict LRU capacity and idle reaping (spec "session (opt-in)" to "Bounds and reaping").

Everything runs on the facade's event loop, so the registry needs no locks: each state change
happens between two awaits. Terms:

- **key**: session id, agent id, canonical cwd, canonical interpreter, helper set and protocol
  version. The kernel id shown to people is an HMAC of it under a per-host salt.
- **entry** (:class:`SessionKernel`): one kernel slot for a key (or a fork of it): the kernel,
  its phase, owners, FIFO queue (:mod:`~lemon_exec.host.sessions.queue`), and why state was
  last lost.
- **owner**: a caller's handle (:class:`lemon_exec.session.SessionOwner`); bindings live in
  :mod:`~lemon_exec.host.sessions.owners`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import os
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lemon_exec.config import ExecuteCodeConfig, canonical_python
from lemon_exec.errors import LemonExecError
from lemon_exec.host.cell import execute as cells
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.host.kernels.start_race import StartLeft, start_within
from lemon_exec.host.run.results import cell_untrusted
from lemon_exec.host.sessions import queue as session_queue
from lemon_exec.host.sessions.owners import OwnerBindings
from lemon_exec.host.sessions.queue import QueueLeft, Ticket
from lemon_exec.scope import AbortSignal, SessionScope
from lemon_exec.wire import protocol

#: Runs one cell on a kernel (the modes' runner, with the tool host behind the bridge).
CellRunner = Callable[[KernelHandle, cells.CellRequest], Awaitable[cells.CellResult]]


class Fallback(Exception):
    """Session mode cannot run this call; run it per-call instead (before any code started)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class SessionKey:
    session_id: str
    agent_id: str
    cwd: str
    interpreter: str
    helpers: tuple[str, ...]
    protocol: int = protocol.PROTOCOL_VERSION

    @classmethod
    def build(
        cls, scope: SessionScope, cwd: Path, interpreter: str, helpers: tuple[str, ...]
    ) -> SessionKey:
        return cls(
            str(scope.session_id),
            str(scope.agent_id),
            str(Path(cwd).resolve()),
            interpreter_identity(interpreter),
            helpers,
        )

    def kernel_id(self, salt: bytes, fork: int) -> str:
        """An opaque id, safe as a file name, that reveals nothing of the key."""
        material = repr((self, fork)).encode("utf-8", "surrogatepass")
        return hmac.new(salt, material, hashlib.sha256).hexdigest()[:20]


@dataclass(eq=False)  # identity semantics: entries live in sets
class SessionKernel:
    key: SessionKey
    kernel_id: str
    fork: int
    kernel: KernelHandle | None = None
    phase: str = "empty"  # empty | starting | idle | running | stopping
    owners: set[int] = field(default_factory=set)
    queue: deque[Ticket] = field(default_factory=deque)
    active: Ticket | None = None
    created: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    cells_run: int = 0
    lost_reason: str | None = None  # why the previous kernel's state is gone
    interpreter: str = ""  # the path to launch: a venv's python must not be resolved
    # The live kernel's state may hold untrusted data (a call fetched web content): every
    # later result from it is untrusted. Only a new kernel (reset, crash, eviction) clears it.
    tainted: bool = False

    @property
    def busy(self) -> bool:
        return (
            self.active is not None
            or bool(self.queue)
            or self.phase in ("starting", "running", "stopping")
        )

    @property
    def holds_kernel(self) -> bool:
        return self.kernel is not None or self.phase == "starting"


@dataclass
class SessionRun:
    cell: cells.CellResult
    details: dict[str, Any]
    tainted: bool = False  # the kernel held untrusted data before this cell ran


class SessionRegistry:
    """Key → kernel entries, owners, queues, LRU eviction and the idle reaper."""

    def __init__(self, engine: Engine, config: ExecuteCodeConfig, run_cell: CellRunner) -> None:
        self._engine = engine
        self.config = config
        self._run_cell = run_cell
        self._salt = secrets.token_bytes(16)
        self._shared: dict[SessionKey, SessionKernel] = {}
        self._bindings: OwnerBindings[SessionKey, SessionKernel] = OwnerBindings()
        self._entries: set[SessionKernel] = set()
        self._fork_counter = itertools.count(1)
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False
        self.evicted_total = 0
        self.reaped_total = 0
        # Kernels being stopped, until their process is confirmed gone: they still count
        # against max_live_kernels (strict cap). The task is the stop attempt.
        self._stopping: dict[KernelHandle, asyncio.Task[bool]] = {}
        # Starts given up when their call's deadline passed or it was aborted, until their
        # process is gone (start_race cancels them in the background): they count too.
        self._settling: set[asyncio.Future[None]] = set()

    # -- running a cell ----------------------------------------------------------------------

    async def execute(
        self,
        owner_id: int,
        key: SessionKey,
        request_for: Callable[[str], cells.CellRequest],
        *,
        reset: bool,
        deadline: float,
        abort: AbortSignal | None,
        interpreter: str = "",
    ) -> SessionRun:
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
            request = request_for(f"cell{entry.cells_run + 1}.py")
            request.aborts = (*request.aborts, ticket.abort)
            try:
                result = await self._run_cell(entry.kernel, request)
            except asyncio.CancelledError:
                self._discard(entry, "cancelled")  # caller death while active
                raise
            entry.cells_run += 1
            entry.last_used = time.monotonic()
            entry.tainted = result.kernel_reusable and (tainted or cell_untrusted(result))
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
            gone = await asyncio.shield(self._retire(kernel, "reset", entry.cells_run))
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
        settling: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settled() -> None:
            self._settling.discard(settling)
            if not settling.done():
                settling.set_result(None)

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
            self._count_settling(settling)
            raise QueueLeft(left.why, "start") from None
        except LemonExecError as exc:
            entry.phase = "empty"
            raise Fallback("startup_failed") from exc
        except BaseException:  # the caller went away: start_within gave the start up
            entry.phase = "empty"
            self._count_settling(settling)
            raise
        entry.kernel.status.public_id = entry.kernel_id
        self._set_phase(entry, "idle")
        entry.cells_run = 0
        entry.lost_reason = None

    def _count_settling(self, settling: asyncio.Future[None]) -> None:
        if not settling.done():  # its process may still be there: it counts until gone
            self._settling.add(settling)

    async def _discard_late(self, kernel: KernelHandle) -> None:
        """Stop a kernel whose start ended after its call left; it counts until gone."""
        await self._retire(kernel, "discarded", 0)

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
        while True:
            await self._prune_stopping()
            live = [e for e in self._entries if e.holds_kernel and e is not entry]
            stopping = len(self._stopping) + len(self._settling)
            over = len(live) + stopping + 1 - self.config.max_live_kernels
            if over <= 0:
                return
            pending: list[asyncio.Future[Any]] = [
                task for task in self._stopping.values() if not task.done()
            ]
            pending += self._settling
            idle = [e for e in live if e.phase == "idle" and e.active is None and not e.queue]
            if len(pending) < over and idle:  # the stops under way do not free enough
                victim = min(idle, key=lambda e: e.last_used)
                self.evicted_total += 1
                self._stop_entry(victim, "evicted", keep_entry=True)
                continue
            if not pending:  # only running work, or kernels whose stop failed
                raise Fallback("capacity_exhausted")
            await self._wait_stopped(pending, deadline, abort)

    async def _wait_stopped(
        self, pending: list[asyncio.Future[Any]], deadline: float, abort: AbortSignal | None
    ) -> None:
        """Wait for one of ``pending`` to end; leave (nothing ran) on deadline or abort."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise QueueLeft("timeout", "capacity")
        if abort is not None and abort.is_set():
            raise QueueLeft("cancelled", "capacity")
        # A short tick: a threading.Event abort can only be polled.
        await asyncio.wait(pending, timeout=min(0.1, remaining))

    async def _prune_stopping(self) -> None:
        """Forget stop attempts that ended with the process gone."""
        for kernel, task in list(self._stopping.items()):
            if task.done() and not await kernel.is_alive():
                self._stopping.pop(kernel, None)

    def _retire(self, kernel: KernelHandle, reason: str, cells_run: int) -> asyncio.Task[bool]:
        """Stop ``kernel`` in the background; it counts as stopping until confirmed gone."""
        task = self._engine.spawn(self._stop_kernel(kernel, reason, cells_run))
        self._stopping[kernel] = task
        return task

    async def _stop_kernel(self, kernel: KernelHandle, reason: str, cells_run: int) -> bool:
        """One stop attempt; True once the process is confirmed gone."""
        with contextlib.suppress(Exception):  # a failed stop leaves the kernel counted
            await self._engine.stop(kernel, reason=reason, mode="session", cells_run=cells_run)
        try:
            gone = not await kernel.is_alive()
        except Exception:
            gone = False
        if gone and self._stopping.get(kernel) is asyncio.current_task():
            del self._stopping[kernel]
        return gone

    def _retry_stuck(self) -> None:
        """Try again to stop kernels whose earlier stop attempt left them running."""
        for kernel, task in list(self._stopping.items()):
            if task.done() and not task.cancelled() and task.result() is False:
                self._retire(kernel, "discarded", 0)

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
            self._retire(kernel, reason, entry.cells_run)
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
            self._retry_stuck()

    def reap_idle(self, now: float | None = None) -> int:
        """Stop kernels idle for longer than kernel_idle_timeout_ms; running work never."""
        now = time.monotonic() if now is None else now
        timeout_s = self.config.kernel_idle_timeout_ms / 1000
        reaped = 0
        for entry in list(self._entries):
            if (
                entry.kernel is not None
                and entry.phase == "idle"
                and entry.active is None
                and not entry.queue
                and now - entry.last_used > timeout_s
            ):
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
        phases["stopping"] = len(self._stopping) + len(self._settling)
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


def interpreter_identity(interpreter: str) -> str:
    """The interpreter part of a key: its canonical path, plus the venv it runs in.

    A venv's ``bin/python`` is a symlink to the base interpreter; resolved alone it would
    share a key (and a kernel) with the base install, whose packages differ.
    """
    canonical = canonical_python(interpreter)
    venv = Path(os.path.abspath(interpreter)).parent.parent
    if (venv / "pyvenv.cfg").is_file():
        return f"{canonical} (venv {venv.resolve()})"
    return canonical
