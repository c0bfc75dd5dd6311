"""The engine: the kernel supervisor under the per-call and session runs.

It owns the private staging root, the kernel backend (where kernels run: see
:mod:`lemon_exec.host.kernels.backend`), the set of live kernels and their index, and the
background stops. The runs ask it to start and stop kernels; it never decides what runs in
them. Everything here lives on one asyncio loop; the runner makes sure of that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from lemon_exec._constants import STARTUP_TIMEOUT_S
from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import InterpreterError, KernelStartError, RefusedError
from lemon_exec.host.disk import hygiene
from lemon_exec.host.disk.index import KernelIndex
from lemon_exec.host.disk.spill_reaper import SpillReaper
from lemon_exec.host.disk.staging import StagingRoot
from lemon_exec.host.disk.staging_base import check_socket_room
from lemon_exec.host.disk.staging_base import staging_base as staging_dir
from lemon_exec.host.disk.worker import DiskWorker
from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.kernels.gateway.backend import GatewayBackend
from lemon_exec.host.kernels.kernelspec import kernel_pythonpath
from lemon_exec.host.kernels.local.backend import LocalBackend
from lemon_exec.host.kernels.resource_limits import LimitSpec
from lemon_exec.host.kernels.sandbox import spec_from_config
from lemon_exec.proc.private_fs import DISK_FULL, describe_os_error
from lemon_exec.telemetry import Telemetry
from lemon_exec.wire.protocol import MANAGED_ENV

log = logging.getLogger(__name__)

_SPILL_REAP_INTERVAL_S = 3600.0


class Engine:
    """Starts, tracks and stops kernels through one backend; owns the staging root."""

    def __init__(
        self,
        config: ExecuteCodeConfig,
        telemetry: Telemetry,
        staging_base: Path | None = None,
    ) -> None:
        self.config = config
        self.telemetry = telemetry
        staging_base = staging_dir(staging_base)  # $TMPDIR, validated: never a fallback
        check_socket_room(staging_base)  # the local backend binds ipc sockets below it
        hygiene.sweep_dead_hosts(staging_base)  # before the staging sweep removes indexes
        self.staging = StagingRoot.create(staging_base)
        try:
            self._pypath = self._make_pypath()
        except BaseException:
            self.staging.close()  # nothing of a host that never started is left behind
            raise
        #: A kernel not ready within this many seconds failed to start (tests lower it).
        self.start_timeout_s = STARTUP_TIMEOUT_S
        self._background: set[asyncio.Task[Any]] = set()
        #: Set once the host closes: kernels are killed at once, with no grace period.
        self._hurry = asyncio.Event()
        self._live: set[KernelHandle] = set()
        #: The host's file work off the event loop: workspaces, the index, the root's removal.
        self.disk = DiskWorker()
        #: Done once the latest call's staging check in flight has finished (check_staging).
        self._staging_gate: asyncio.Future[None] | None = None
        self.index = KernelIndex(
            self.staging.path, lambda: [k.status for k in self._live], self.disk
        )
        self.backend: LocalBackend | GatewayBackend
        if config.gateway_url:  # kernels behind an Enterprise Gateway (docs/scale-out.md)
            self.backend = GatewayBackend(config, spawn=self.spawn)
        else:
            self.backend = LocalBackend(
                self.staging,
                fork_server=config.fork_server,
                spawn=self.spawn,
                limits=LimitSpec(
                    config.kernel_memory_mb,
                    config.kernel_max_processes,
                    config.kernel_max_open_files,
                ),
                sandbox=spec_from_config(config),
                hurry=self._hurry,
            )
        self._closed = False  # no new kernels
        self._finished = False  # aclose ran
        self._reap_handle: asyncio.TimerHandle | None = None
        self.reaper = SpillReaper(self.staging.path)  # finds the stale roots now, at boot
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
        for kernel in list(self._live):
            kernel.kill_sync()
        self.backend.emergency_cleanup()
        self.disk.close()
        self.staging.close()

    def ensure_staging(self) -> None:
        """Recreate the staging root if a script deleted it (or parts); validate it.

        Raises ``RefusedError`` when it cannot be made private again (fail closed).
        """
        with self.staging.checking():
            self.staging.ensure()
            self._pypath = self._make_pypath()

    def staging_intact(self) -> bool:
        """Whether the staging root is as its last check left it (no disk access): then a
        call need not check it again (:meth:`StagingRoot.intact`)."""
        return self.staging.intact()

    async def check_staging(self) -> None:
        """A call's check of the staging root, on the disk worker; skipped while it is
        intact. ``RefusedError`` if it cannot be made private again.

        Calls leave this step in the order they entered it (admission after it is FIFO): one
        that could skip the check still waits for an earlier call's check in flight, and
        goes on only after that call did.
        """
        while (gate := self._staging_gate) is not None and not gate.done():
            await asyncio.shield(gate)
        if self.staging_intact():
            return
        gate = self._staging_gate = asyncio.get_running_loop().create_future()
        try:
            await self.disk.call(self.ensure_staging)
        finally:
            gate.set_result(None)  # its waiters resume after this call has gone on

    def _make_pypath(self) -> str:
        """The kernels' PYTHONPATH directory in the staging root, made if missing."""
        try:
            return kernel_pythonpath(self.staging.pypath_dir)
        except OSError as exc:
            raise RefusedError(
                f"execute_code: could not create a private workspace: cannot create "
                f"{self.staging.pypath_dir}: {describe_os_error(exc)}"
            ) from None

    # -- kernels -------------------------------------------------------------------------------

    async def start_kernel(
        self, interpreter: str, cwd: str, *, mode: str, source: str = "cold"
    ) -> KernelHandle:
        """Start a kernel; every failure is a ``KernelStartError`` (or ``RefusedError``)."""
        if self._closed:
            raise RefusedError("execute_code: the tool is shutting down")
        if not self.staging_intact():
            self.ensure_staging()
        started = time.monotonic()
        ok = False
        try:
            kernel = await self.backend.start(
                interpreter, cwd, env=self._kernel_env(), timeout=self.start_timeout_s
            )
            ok = True
        except InterpreterError:
            raise
        except TimeoutError as exc:
            # The launch (or a fork request) outlived the startup timeout, typically on an
            # overloaded host: a start failure, never a bare TimeoutError.
            raise StartTimeout(
                f"execute_code: the kernel did not start within {self.start_timeout_s:.0f} s "
                "(the host may be overloaded); nothing ran; try again shortly"
            ) from exc
        except KernelStartError as exc:
            if time.monotonic() - started >= self.start_timeout_s:
                raise StartTimeout(str(exc)) from exc
            if not isinstance(exc, StagingStartError) and _disk_full(str(exc)):
                # The kernel itself could not bind its sockets in runtime/ (zmq's ENOSPC).
                raise StagingStartError(
                    "execute_code: could not create a private workspace: the kernel could "
                    f"not create its sockets in {self.staging.runtime_dir}: {exc}"
                ) from exc
            raise
        except OSError as exc:  # e.g. the fork server died mid-request, or a full disk
            if exc.errno in DISK_FULL:  # the kernel's files in runtime/ could not be written
                raise StagingStartError(
                    "execute_code: could not create a private workspace: cannot write a "
                    f"kernel's files in {self.staging.runtime_dir}: {describe_os_error(exc)}"
                ) from exc
            raise KernelStartError(
                f"execute_code: could not start a kernel: {describe_os_error(exc)}"
            ) from exc
        finally:
            self.telemetry.emit(
                "kernel.start",
                {"duration_ms": int((time.monotonic() - started) * 1000)},
                {"mode": mode, "source": source, "ok": ok},
            )
        if self._finished:  # it started while the host closed: nothing may outlive aclose
            await kernel.kill()
            raise RefusedError("execute_code: the tool is shutting down")
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

    def warm_up(self, interpreter: str) -> None:
        """Let the backend prepare fast starts for ``interpreter`` (the fork server)."""
        self.backend.warm_up(interpreter, self._kernel_env())

    async def stop(
        self, kernel: KernelHandle, *, reason: str, mode: str, cells_run: int = 1
    ) -> None:
        """Stop ``kernel`` now: SIGTERM its group, one grace period, then SIGKILL."""
        lifetime = int((time.monotonic() - kernel.started_at) * 1000)
        # If disposal fails the kernel stays tracked, so that closing the facade kills it.
        await self.backend.stop(kernel)
        self._live.discard(kernel)
        self.index.touch()
        self.telemetry.emit(
            "kernel.stop",
            {"lifetime_ms": lifetime, "cells": cells_run},
            {"mode": mode, "reason": reason},
        )

    def discard(self, kernel: KernelHandle, *, reason: str, mode: str, cells_run: int = 1) -> None:
        """Like :meth:`stop`, in the background; tracked so that close waits for it."""
        self.spawn(self.stop(kernel, reason=reason, mode=mode, cells_run=cells_run))

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` in the background; :meth:`aclose` waits for it."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def touch(self) -> None:
        """A kernel's status changed: rewrite the index (debounced)."""
        self.index.touch()

    @property
    def live(self) -> frozenset[KernelHandle]:
        """The kernels started and not yet confirmed stopped."""
        return frozenset(self._live)

    @property
    def live_kernels(self) -> int:
        return len(self._live)

    # -- shutdown -------------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Whether the host is closing: no kernel starts any more."""
        return self._closed

    def refuse_starts(self) -> None:
        """From now on no kernel starts, and stops kill without a grace period (the runs are
        closing their kernels, and whatever is left is killed right after)."""
        self._closed = True
        self._hurry.set()

    async def aclose(self) -> None:
        """Kill every kernel and stop the templates, then remove the private files.

        Nothing is waited for but the ends themselves: stops under way skip what is left of
        their grace periods (see :meth:`refuse_starts`), kernels are killed and the templates
        told to go at the same time, each exit is awaited on its pidfd, and the staging root
        is removed on the disk worker once the file work queued before it is done.
        """
        if self._finished:
            return
        self._finished = self._closed = True
        self._hurry.set()
        templates = asyncio.ensure_future(self._close_templates())
        try:
            while self._background:
                await asyncio.gather(*list(self._background), return_exceptions=True)
            await asyncio.gather(*(k.kill() for k in list(self._live)), return_exceptions=True)
            self._live.clear()
        finally:
            await templates
        await self.backend.aclose()  # the templates are gone: the kernels' cgroups go
        self.index.close()
        if self._reap_handle is not None:
            self._reap_handle.cancel()
        self.reaper.close()
        await self.disk.aclose(self.staging.close)
        hygiene.unregister(self)

    async def _close_templates(self) -> None:
        """Tell the fork-server templates to go (they kill the kernels they forked)."""
        if isinstance(self.backend, LocalBackend):
            await self.backend.close_templates()


class StartTimeout(KernelStartError):
    """A kernel start that ran out of its startup time."""


class StagingStartError(KernelStartError):
    """A kernel start that could not write its files in the staging root (a full disk)."""


def _disk_full(message: str) -> bool:
    """Whether a kernel's own start failure (its last words, as text) names a full disk."""
    return any(os.strerror(code) in message for code in DISK_FULL)


def _join_path(first: str, rest: str | None) -> str:
    return first if not rest else first + os.pathsep + rest


__all__ = ["Engine", "StagingStartError", "StartTimeout"]
