"""Diagnostics: a read-only view of one facade's host, for tests and operators.

:class:`Diagnostics` (``ExecuteCode.diagnostics``) answers what is running and where, from the
objects the runner owns, without handing those objects out: each property is read when it is
asked for (a live view, never a stale copy), and returns plain values (counts, paths, pids,
small frozen records). Nothing here starts, stops or changes anything. Before the first call
(or after closing) the host does not exist: ``started`` is false, counts are 0, paths None.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lemon_exec.host.kernels.local.backend import LocalBackend

if TYPE_CHECKING:
    from lemon_exec.host.run.runner import Host, Runner


@dataclass(frozen=True)
class KernelInfo:
    """One live kernel: its process, its phase and its connection file."""

    pid: int | None
    mode: str  # per_call | session
    phase: str  # spare | starting | idle | running | stopping
    connection_file: Path


@dataclass(frozen=True)
class TemplateInfo:
    """One fork-server template (local kernels only), per interpreter."""

    interpreter: str
    pid: int | None  # the launched process (bwrap's, when sandboxed)
    template_pid: int | None  # the template itself
    ready: bool  # forking kernels now
    sandboxed: bool


class Diagnostics:
    """What one :class:`~lemon_exec.ExecuteCode` runs, as plain values (see the module)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner

    @property
    def _host(self) -> Host | None:
        return self._runner.host

    @property
    def started(self) -> bool:
        """Whether the host exists: its private staging root and kernel supervisor."""
        return self._host is not None

    # -- the private staging root ---------------------------------------------------------------

    @property
    def staging_root(self) -> Path | None:
        """The private staging root (0700, one per facade), or None before it is made."""
        host = self._host
        return host.engine.staging.path if host is not None else None

    @property
    def work_dir(self) -> Path | None:
        """Where per-call runs get their private workspaces."""
        host = self._host
        return host.engine.staging.work_dir if host is not None else None

    @property
    def spill_dir(self) -> Path | None:
        """Where the full output of truncated runs is spilled (``full_output_path``)."""
        host = self._host
        return host.engine.staging.spill_dir if host is not None else None

    @property
    def runtime_dir(self) -> Path | None:
        """Where kernel connection files and sockets live."""
        host = self._host
        return host.engine.staging.runtime_dir if host is not None else None

    # -- kernels -------------------------------------------------------------------------------

    @property
    def live_kernels(self) -> int:
        """Kernels started and not yet confirmed stopped (spares and session kernels too)."""
        host = self._host
        return host.engine.live_kernels if host is not None else 0

    @property
    def kernels(self) -> tuple[KernelInfo, ...]:
        """Every live kernel, in no particular order."""
        host = self._host
        if host is None:
            return ()
        return tuple(
            KernelInfo(k.pid, k.status.mode, k.status.phase, Path(k.status.connection_file))
            for k in host.engine.live
        )

    @property
    def templates(self) -> tuple[TemplateInfo, ...]:
        """The fork-server templates (none for gateway kernels or with fork_server off)."""
        host = self._host
        backend = host.engine.backend if host is not None else None
        if not isinstance(backend, LocalBackend):
            return ()
        return tuple(
            TemplateInfo(name, s.pid, s.template_pid, s.ready, s.sandboxed)
            for name, s in backend.templates().items()
        )

    async def wait_template(self, timeout: float) -> TemplateInfo | None:
        """The first ready template, waiting up to ``timeout`` seconds for one (else None)."""
        deadline = time.monotonic() + timeout
        while True:
            ready = [t for t in self.templates if t.ready]
            if ready or time.monotonic() >= deadline:
                return ready[0] if ready else None
            await asyncio.sleep(0.05)

    # -- per-call mode -------------------------------------------------------------------------

    @property
    def spares(self) -> int:
        """Warm per-call spares ready to be claimed."""
        host = self._host
        return host.per_call.pool.spare_count if host is not None else 0

    @property
    def spares_starting(self) -> int:
        """Per-call spares on their way up."""
        host = self._host
        return host.per_call.pool.starting if host is not None else 0

    @property
    def spare_pids(self) -> tuple[int, ...]:
        """The process ids of the ready spares."""
        host = self._host
        if host is None:
            return ()
        return tuple(k.pid for k in host.per_call.pool.all_spares() if k.pid is not None)

    @property
    def stale_spares_discarded(self) -> int:
        """Spares thrown away unused because the environment changed after they started."""
        host = self._host
        return host.per_call.pool.stale_discarded if host is not None else 0

    @property
    def spare_burst(self) -> int:
        """How many spares may be starting at once beyond ``warm_kernels``."""
        host = self._host
        return host.per_call.pool.max_burst if host is not None else 0

    @property
    def per_call_running(self) -> int:
        """Per-call admission slots held (a slot is freed once its kernel is stopped)."""
        host = self._host
        return host.per_call.admission.running if host is not None else 0

    @property
    def per_call_waiting(self) -> int:
        """Per-call runs waiting in the admission queue for a slot."""
        host = self._host
        return host.per_call.admission.waiting if host is not None else 0

    @property
    def per_call_limit(self) -> int:
        """How many per-call runs may hold a slot at once (``max_concurrent_per_call``)."""
        host = self._host
        return host.per_call.admission.limit if host is not None else 0

    # -- sessions and tools --------------------------------------------------------------------

    @property
    def sessions(self) -> dict[str, Any]:
        """The aggregate counts of :meth:`ExecuteCode.snapshot` (no identities)."""
        return self._runner.snapshot()

    @property
    def tool_worker_pids(self) -> frozenset[int]:
        """The tool host's worker processes (grep and find run in them)."""
        return frozenset(self._runner.tool_host.worker_pids())
