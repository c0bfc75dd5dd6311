"""The engine behind the facade: owns the staging root, spares, sessions and tool host.

It runs validated calls in the configured mode and assembles results. Everything here lives
on one asyncio loop; the facade makes sure of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lemon_exec._constants import STARTUP_TIMEOUT_S
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import InterpreterError, KernelStartError, LemonExecError, RefusedError
from lemon_exec.host import cell as cells
from lemon_exec.host import hygiene
from lemon_exec.host.admission import Admission, Denied, Slot, default_limit
from lemon_exec.host.bridge import BridgeLimits
from lemon_exec.host.cell import AbortSignal
from lemon_exec.host.forkserver import ForkServer
from lemon_exec.host.index import KernelIndex
from lemon_exec.host.kernel import ManagedKernel
from lemon_exec.host.kernelspec import kernel_pythonpath
from lemon_exec.host.pool import KernelPool
from lemon_exec.host.reaper import SpillReaper
from lemon_exec.host.staging import StagingRoot
from lemon_exec.host.staging import staging_base as staging_dir
from lemon_exec.kernel.protocol import MANAGED_ENV
from lemon_exec.result import ExecuteCodeResult, build_result, refusal
from lemon_exec.telemetry import Telemetry
from lemon_exec.tools import ToolHost

log = logging.getLogger(__name__)

_SPILL_REAP_INTERVAL_S = 3600.0
#: A fork server that died (e.g. the interpreter lacks ipykernel) is retried this rarely.
_FORK_SERVER_RETRY_S = 60.0
#: Fork-server ids are keys of a process-wide registry: unique across engines.
_SERVER_IDS = itertools.count(1)
#: Most fork-server templates kept after an environment change made them stale.
_MAX_RETIRED_FORK_SERVERS = 2
#: A spare's empty warm-up cell must finish within this many seconds.
_WARM_CELL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Call:
    """One validated execute_code call, as the facade hands it to a mode."""

    script: str
    interpreter: str
    cwd: Path
    deadline: float  # time.monotonic() by which the whole call must end
    timeout_ms: int  # as reported in a timeout headline
    abort: AbortSignal | None
    on_update: Callable[[str], None] | None
    details: dict[str, Any]
    on_output: Callable[[str], None] | None = None  # the script's output, live
    filename: str = "script.py"  # what tracebacks call the script
    argv: tuple[str, ...] | None = None  # sys.argv in the script; None leaves it alone


class Engine:
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
        staging_base = staging_dir(staging_base)  # $TMPDIR, validated: never a fallback
        hygiene.sweep_dead_hosts(staging_base)  # before the staging sweep removes indexes
        self.staging = StagingRoot.create(staging_base)
        self._pypath = kernel_pythonpath(self.staging.path / "pypath")
        self.pool = KernelPool(
            self._start_cold,
            config.warm_kernels,
            start_spare=self._start_spare,
            discard=lambda k: self.discard(k, reason="stale_env", mode="per_call", cells_run=0),
        )
        self.admission = Admission(
            config.max_concurrent_per_call or default_limit(), config.max_queued_per_call
        )
        #: A kernel not ready within this many seconds failed to start (tests lower it).
        self.start_timeout_s = STARTUP_TIMEOUT_S
        self._background: set[asyncio.Task[Any]] = set()
        self._live: set[ManagedKernel] = set()
        self.index = KernelIndex(self.staging.path, lambda: [k.status for k in self._live])
        self.sessions: Any = None  # set by the facade when session mode is first used
        self._closed = False
        self._reap_handle: asyncio.TimerHandle | None = None
        self.reaper = SpillReaper(self.staging.path)  # finds the stale roots now, at boot
        self._forkservers: dict[str, ForkServer] = {}
        #: The startup variables (see _startup_env) each fork server was started with.
        self._forkserver_env: dict[str, dict[str, str]] = {}
        #: Templates replaced after the environment changed: kernels they forked (spares,
        #: session kernels) still run under them, so they stay until the engine closes.
        self._retired: list[ForkServer] = []
        self._reap_spills()
        hygiene.register(self)

    def _reap_spills(self) -> None:
        """Remove expired spill files: checked hourly, one batch per 24-hour window."""
        try:
            self.reaper.run()
        except OSError:
            log.warning("spill reaping failed", exc_info=True)
        with contextlib.suppress(RuntimeError):  # no running loop: the next engine reaps
            self._reap_handle = asyncio.get_running_loop().call_later(
                _SPILL_REAP_INTERVAL_S, self._reap_spills
            )

    def emergency_cleanup(self) -> None:
        """Exit-time cleanup without a loop: kill every kernel, remove the staging root."""
        for kernel in list(self._live) + self.pool.all_spares():
            kernel.kill_sync()
        for server in [*self._forkservers.values(), *self._retired]:
            server.kill_sync()
        self.staging.close()

    def ensure_staging(self) -> None:
        """Recreate the staging root if a script deleted it (or parts); validate it.

        Raises ``RefusedError`` when it cannot be made private again (fail closed).
        """
        self.staging.ensure()
        try:
            self._pypath = kernel_pythonpath(self.staging.path / "pypath")
        except OSError as exc:
            raise RefusedError(
                f"execute_code: could not create a private workspace: cannot recreate "
                f"{self.staging.path / 'pypath'}: {exc}"
            ) from None

    # -- kernels -------------------------------------------------------------------------------

    async def start_kernel(
        self, interpreter: str, cwd: str, *, mode: str, source: str = "cold"
    ) -> ManagedKernel:
        """Start a kernel; every failure is a ``KernelStartError`` (or ``RefusedError``)."""
        if self._closed:
            raise RefusedError("execute_code: the tool is shutting down")
        self.ensure_staging()
        started = time.monotonic()
        env = self._kernel_env()
        server = self._fork_server(interpreter)
        ok = False
        try:
            kernel = await ManagedKernel.start(
                interpreter=interpreter,
                cwd=cwd,
                runtime_dir=self.staging.runtime_dir,
                env=env,
                fork_server_id=server.server_id if server is not None and server.ready else "",
                timeout=self.start_timeout_s,
            )
            ok = True
        except InterpreterError:
            raise
        except (TimeoutError, asyncio.TimeoutError) as exc:
            # jupyter_client's launch (or a fork request) outlived the startup timeout,
            # typically on an overloaded host: a start failure, never a bare TimeoutError.
            raise StartTimeout(
                f"execute_code: the kernel did not start within {self.start_timeout_s:.0f} s "
                "(the host may be overloaded); nothing ran; try again shortly"
            ) from exc
        except KernelStartError as exc:
            if time.monotonic() - started >= self.start_timeout_s:
                raise StartTimeout(str(exc)) from exc
            raise
        except OSError as exc:  # e.g. the fork server died mid-request
            raise KernelStartError(f"execute_code: could not start a kernel: {exc}") from exc
        finally:
            self.telemetry.emit(
                "kernel.start",
                {"duration_ms": int((time.monotonic() - started) * 1000)},
                {"mode": mode, "source": source, "ok": ok},
            )
        kernel.status.pid = kernel.pid or 0  # recorded in the index for sweep_dead_hosts
        kernel.status.mode = mode
        if mode == "session":
            kernel.publish()  # to Jupyter Server, when configured (docs/inspection.md)
        kernel.status.phase = "spare" if source == "spare" else "idle"
        self._live.add(kernel)
        self.index.touch()
        return kernel

    def _kernel_env(self) -> dict[str, str]:
        return {
            "PYTHONPATH": _join_path(self._pypath, os.environ.get("PYTHONPATH")),
            MANAGED_ENV: "1",  # the kernel refuses shutdown requests from attached clients
        }

    def _fork_server(self, interpreter: str) -> ForkServer | None:
        """The interpreter's fork server, started in the background on first use.

        Until it is ready (it imports the kernel's modules once, ~0.4 s) kernels start the
        ordinary way, so the fork server never delays a start.
        """
        if not self.config.fork_server:
            return None
        env = {**os.environ, **self._kernel_env()}
        server = self._forkservers.get(interpreter)
        if server is not None and self._forkserver_env.get(interpreter) != _startup_env(env):
            # A forked kernel gets the current environment, but what the interpreter read at
            # startup (sys.path from PYTHONPATH, the loader's LD_*, the locale) is the
            # template's: a template started under other values is retired, never used.
            # Closing it would kill the kernels it forked, so it waits for the engine's close;
            # after a few such changes kernels simply start the ordinary way.
            if len(self._retired) >= _MAX_RETIRED_FORK_SERVERS:
                return None
            self._forkservers.pop(interpreter)
            self._retired.append(server)
            server = None
        if server is not None and (server.alive or not server.started):
            return server
        if server is not None:  # it died: retire it, and retry at most once a minute
            self.spawn(server.aclose())
            if time.monotonic() - server.created < _FORK_SERVER_RETRY_S:
                return None
        server = ForkServer(
            f"{os.getpid()}-{next(_SERVER_IDS)}", interpreter, env, str(self.staging.work_dir)
        )
        self._forkserver_env[interpreter] = _startup_env(env)
        self._forkservers[interpreter] = server
        self.spawn(server.start())
        return server

    def warm_up(self, interpreter: str, *, per_call: bool) -> None:
        """Start the fork server, and per-call spares, for ``interpreter`` in the background."""
        self._fork_server(interpreter)
        if per_call:
            self.pool.refill(interpreter)

    async def _start_cold(self, interpreter: str) -> ManagedKernel:
        return await self.start_kernel(interpreter, str(self.staging.work_dir), mode="per_call")

    async def _start_spare(self, interpreter: str) -> ManagedKernel:
        kernel = await self.start_kernel(
            interpreter, str(self.staging.work_dir), mode="per_call", source="spare"
        )
        # One empty script cell pays the first-cell costs (lazy imports, and in a forked
        # kernel the copy-on-write faults: ~8 ms) before a caller waits. It defines nothing,
        # so the namespace a run finds is still fresh.
        warm = self.cell_request(
            "pass",
            cwd=self.staging.work_dir,
            deadline=time.monotonic() + _WARM_CELL_TIMEOUT_S,
            chdir=False,
            aborts=(),
            on_update=None,
        )
        try:
            result = await cells.run_cell(kernel, warm, self.tool_host)
        except BaseException:
            await self.stop(kernel, reason="discarded", mode="per_call", cells_run=0)
            raise
        if result.end != "ok":
            await self.stop(kernel, reason="discarded", mode="per_call", cells_run=0)
            raise KernelStartError("execute_code: a spare kernel failed its warm-up cell")
        return kernel

    async def stop(
        self, kernel: ManagedKernel, *, reason: str, mode: str, cells_run: int = 1
    ) -> None:
        """Stop ``kernel`` now: SIGTERM its group, one grace period, then SIGKILL."""
        lifetime = int((time.monotonic() - kernel.started_at) * 1000)
        # If disposal fails the kernel stays tracked, so that closing the facade kills it.
        await cells.dispose(kernel)
        self._live.discard(kernel)
        self.index.touch()
        self.telemetry.emit(
            "kernel.stop",
            {"lifetime_ms": lifetime, "cells": cells_run},
            {"mode": mode, "reason": reason},
        )

    def discard(self, kernel: ManagedKernel, *, reason: str, mode: str, cells_run: int = 1) -> None:
        """Like :meth:`stop`, in the background; tracked so that close waits for it."""
        self.spawn(self.stop(kernel, reason=reason, mode=mode, cells_run=cells_run))

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    @property
    def live_kernels(self) -> int:
        return len(self._live)

    # -- cells ----------------------------------------------------------------------------------

    def limits(self) -> BridgeLimits:
        c = self.config
        return BridgeLimits(
            max_calls=c.max_rpc_calls,
            max_result_bytes=c.max_rpc_result_bytes,
            max_text_bytes=c.max_text_bytes,
            max_parallel=c.max_parallel_rpc,
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
            limits=self.limits(),
            max_output_bytes=self.config.max_output_bytes,
            max_spill_bytes=self.config.max_spill_bytes,
            spill_dir=self.staging.spill_dir,
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

    async def run_per_call(self, call: Call, notes: list[str] | None = None) -> ExecuteCodeResult:
        """One script in a fresh kernel and a fresh private workspace, both gone afterwards.

        The run first takes one of the admission slots (waiting in the bounded queue, on the
        call's own deadline); the slot is held until its kernel is confirmed stopped.
        """
        slot = await self.admission.acquire(call.deadline, call.abort)
        if isinstance(slot, Denied):
            return self._denied(slot, call)
        kernel: ManagedKernel | None = None
        details = {**call.details, "queue_wait_ms": slot.waited_ms}
        try:
            try:
                workspace = self.staging.new_workspace()
            except RefusedError as exc:
                return refusal(str(exc), details)
            try:
                self.staging.write_private_file(workspace, "script.py", call.script)
                try:
                    kernel, source = await self.pool.claim(call.interpreter)
                except KernelStartError as exc:
                    return start_failure(exc, details)
                except LemonExecError as exc:
                    return refusal(str(exc), details)
                kernel.status.phase = "running"
                self.index.touch()
                try:
                    request = self.call_request(call, chdir=True)
                    result = await cells.run_cell(kernel, request, self.tool_host)
                finally:
                    # A used kernel is never reused: stopped in the background, off the hot
                    # path. Its slot is freed once it is gone, so the cap bounds live kernels.
                    self.spawn(self._stop_and_release(kernel, slot))
            finally:
                self.staging.remove_workspace(workspace)
        finally:
            if kernel is None:  # no kernel to wait for: the slot is free now
                slot.release()
        details["kernel_source"] = source
        return build_result(result, timeout_ms=call.timeout_ms, details=details, notes=notes)

    async def _stop_and_release(self, kernel: ManagedKernel, slot: Slot) -> None:
        try:
            await self.stop(kernel, reason="finished", mode="per_call")
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
            return refusal("execute_code: the tool is shutting down; nothing ran.", details)
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

    # -- shutdown -------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop spares, sessions and every kernel; wait for background stops; remove files."""
        if self._closed:
            return
        self._closed = True
        self.admission.close()
        if self.sessions is not None:
            with contextlib.suppress(Exception):
                await self.sessions.aclose()
        await self.pool.aclose()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        await asyncio.gather(*(k.kill() for k in list(self._live)), return_exceptions=True)
        self._live.clear()
        await asyncio.gather(
            *(s.aclose() for s in [*self._forkservers.values(), *self._retired]),
            return_exceptions=True,
        )
        self._forkservers.clear()
        self._retired.clear()
        self.index.close()
        if self._reap_handle is not None:
            self._reap_handle.cancel()
        self.reaper.close()
        self.staging.close()
        hygiene.unregister(self)


class StartTimeout(KernelStartError):
    """A kernel start that ran out of its startup time."""


def start_failure(exc: KernelStartError, details: dict[str, Any]) -> ExecuteCodeResult:
    """The result of a run whose kernel could not start: nothing ran; the reason is kept."""
    if isinstance(exc, InterpreterError):
        kind = "interpreter"
    elif isinstance(exc, StartTimeout):
        kind = "timeout"
    else:
        kind = "failed"
    return refusal(str(exc), {**details, "startup_failed": True, "startup_error": kind})


#: Variables an interpreter reads when it starts, so a forked kernel keeps its template's.
_STARTUP_PREFIXES = ("PYTHON", "LD_", "LC_", "LANG")


def _startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(_STARTUP_PREFIXES)}


def _join_path(first: str, rest: str | None) -> str:
    return first if not rest else first + os.pathsep + rest


__all__ = ["Call", "Engine", "StartTimeout", "start_failure"]
