"""The runner: the one way a call runs, whoever makes it.

``ExecuteCode.run`` and every ``SessionOwner.run`` call :meth:`Runner.run`, which checks the
arguments (:func:`~lemon_exec.host.run.calls.prepare`; the call's deadline starts when it
enters), binds the runner to its event loop, makes the host on first use, lists the MCP
servers' tools, and routes the call: per-call (:mod:`~lemon_exec.host.run.per_call`) or into
its session (:mod:`~lemon_exec.host.run.in_session`). Every result, refusals included, leaves
through :func:`finish` (its duration and its telemetry event).

The host (:class:`Host`) is what a first call makes: the kernel supervisor with its private
staging root, the per-call runs (spares, admission) and the session runs (the registry). It
exists from the first call (or ``warm_up``/``attach``) until ``aclose``; ownership flows one
way: facade → runner → host → engine → backend and kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import ConfigError, RefusedError
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.host.run import heap
from lemon_exec.host.run.calls import Call, CallArgs, base_details, prepare
from lemon_exec.host.run.in_session import SessionRuns
from lemon_exec.host.run.jobs import JobRun, JobTable
from lemon_exec.host.run.per_call import PerCallRuns, workspace_refused
from lemon_exec.host.run.requests import CellRequests
from lemon_exec.host.run.results import refusal
from lemon_exec.host.sessions.owners import new_owner_id
from lemon_exec.host.sessions.registry import SessionRegistry
from lemon_exec.result import ExecuteCodeResult
from lemon_exec.telemetry import Telemetry, stop_event
from lemon_exec.tools import ToolHost

FACADE_CLOSED = "this ExecuteCode facade is closed"
OTHER_LOOP = (
    "an ExecuteCode facade is bound to the event loop it was first used on; "
    "create one facade per loop (or use run_sync from threads)"
)
OWNER_CLOSED = "execute_code: this session owner handle is closed"


class Owner(Protocol):
    """What the runner needs of a session owner handle (``lemon_exec.session.SessionOwner``)."""

    @property
    def owner_id(self) -> int: ...

    @property
    def closed(self) -> bool: ...


@dataclass
class Host:
    """What runs calls: the kernel supervisor, the per-call runs and the session runs."""

    engine: Engine
    per_call: PerCallRuns
    sessions: SessionRuns

    @classmethod
    def build(
        cls,
        config: ExecuteCodeConfig,
        tool_host: ToolHost,
        telemetry: Telemetry,
        staging_base: Path | None,
    ) -> Host:
        engine = Engine(config, telemetry, staging_base)  # RefusedError: no staging root
        requests = CellRequests(config, tool_host, engine.staging)
        per_call = PerCallRuns(config, engine, tool_host, requests)
        registry = SessionRegistry(engine, config, tool_host)
        return cls(engine, per_call, SessionRuns(config, registry, per_call, requests, telemetry))

    async def aclose(self) -> None:
        """Stop spares, sessions and every kernel; wait for background stops; remove files."""
        self.engine.refuse_starts()
        self.per_call.admission.close()
        with contextlib.suppress(Exception):
            await self.sessions.registry.aclose()
        await self.per_call.pool.aclose()
        await self.engine.aclose()


class Runner:
    """Runs every call of one facade and its owners; makes and owns the :class:`Host`."""

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
        self._staging_base = staging_base
        #: Made on first use, on the loop the runner is then bound to; None once closed.
        self.host: Host | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        #: Calls run as background jobs (``start``): through :meth:`run`, like any call.
        self.jobs = JobTable(config, self.run)

    def bind(self) -> Host:
        """The host, made on first use; bound to the running loop.

        Raises ``RuntimeError`` when closed or called from another event loop, and
        ``RefusedError`` when the private staging root cannot be made (nothing is kept).
        """
        loop = asyncio.get_running_loop()
        if self.closed:
            raise RuntimeError(FACADE_CLOSED)
        if self.loop is None:
            self.loop = loop
        elif self.loop is not loop:
            raise RuntimeError(OTHER_LOOP)
        if self.host is None:
            self.host = Host.build(self.config, self.tool_host, self.telemetry, self._staging_base)
        return self.host

    async def run(self, args: CallArgs, owner: Owner | None = None) -> ExecuteCodeResult:
        """Run one call (``owner``: the session owner handle it came through, if any)."""
        entered = time.monotonic()
        result = finish(await self._run(args, owner, entered), entered, self.telemetry)
        if self.config.gc_freeze:
            heap.freeze_once()  # after the first call, all it imported is frozen too
        return result

    async def _run(self, args: CallArgs, owner: Owner | None, entered: float) -> ExecuteCodeResult:
        if owner is not None and owner.closed:
            return refusal(OWNER_CLOSED, base_details("session"))
        call = prepare(self.config, args, entered)  # checked before anything starts
        if not isinstance(call, Call):
            return call
        try:
            host = self.bind()
            # A script may have deleted it: made again, or refused (on the disk worker).
            await host.engine.check_staging()
        except RefusedError as exc:
            return staging_refused(exc, call.details, self.config.mode, self.telemetry)
        # MCP servers' tools are listed (connecting once) before the kernel is told the names.
        await self.tool_host.prepare_tools()
        if self.config.mode == "session":
            return await host.sessions.run(call, owner.owner_id if owner is not None else None)
        return await host.per_call.run(call)

    def start(self, args: CallArgs, owner: Owner | None = None) -> JobRun:
        """Start one call as a job: :meth:`run` in a task of its own (see ``jobs.py``).

        Raises ``RuntimeError`` as :meth:`bind` does (closed, or another event loop).
        """
        loop = asyncio.get_running_loop()
        if self.closed:
            raise RuntimeError(FACADE_CLOSED)
        if self.loop is not None and self.loop is not loop:
            raise RuntimeError(OTHER_LOOP)
        self.loop = loop
        return self.jobs.start(args, owner)

    async def warm_up(self, cwd: str | os.PathLike[str] | None) -> None:
        """Start the fork server, per-call spares and MCP connections (see the facade)."""
        if not self.config.enabled:
            return
        try:
            interpreter = self.config.resolve_python(cwd)
            host = self.bind()
        except (ConfigError, RefusedError):
            return
        host.engine.warm_up(interpreter)
        if self.config.mode != "session":
            host.per_call.warm_up(interpreter)
        await self.tool_host.prepare_tools()  # MCP servers connect and list their tools now

    def attach(self) -> int:
        """A new owner id, on this runner's loop (the facade makes the handle around it)."""
        self.bind()
        return new_owner_id()

    async def detach(self, owner_id: int) -> None:
        if self.host is not None:
            await self.host.sessions.registry.detach(owner_id)

    def detach_soon(self, owner_id: int) -> None:
        if self.host is not None:
            self.host.sessions.registry.detach_soon(owner_id)

    def snapshot(self) -> dict[str, Any]:
        """Aggregate kernel counts (no identities): the session registry plus spares."""
        host = self.host
        if host is None:
            return {
                "live": 0,
                "capacity": self.config.max_live_kernels,
                "phases": {"starting": 0, "idle": 0, "running": 0, "stopping": 0},
                "owners": 0,
                "forks": 0,
                "queued": 0,
                "evicted_total": 0,
                "reaped_total": 0,
                "idle_timeout_ms": self.config.kernel_idle_timeout_ms,
                "max_queued_cells_per_kernel": self.config.max_queued_cells_per_kernel,
                "spares": 0,
                "kernels_total": 0,
            }
        counts = host.sessions.registry.snapshot()
        counts["spares"] = host.per_call.pool.spare_count
        counts["kernels_total"] = host.engine.live_kernels
        return counts

    async def aclose(self) -> None:
        """Cancel the jobs, stop every kernel, remove the private files, stop the tool workers.

        Each live job ends through its abort (partial output in its result) before the host
        closes; finished jobs stay readable until they expire.
        """
        self.closed = True
        await self.jobs.aclose()
        if self.host is not None:
            host, self.host = self.host, None
            await host.aclose()
        await self.jobs.settle()
        await self.tool_host.aclose()  # its grep/find worker processes


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
