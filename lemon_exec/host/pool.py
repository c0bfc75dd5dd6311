"""Warm spares for per-call runs: kernels started ahead of time, each used exactly once.

A cold kernel start costs ~50x a bare ``python3`` start, so per-call mode claims a spare
that is already running and refills in the background. A claimed kernel is never returned
to the pool; a spare that died is replaced, never handed out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from lemon_exec.host.kernel import ManagedKernel

log = logging.getLogger(__name__)

Starter = Callable[[str], Awaitable[ManagedKernel]]


class KernelPool:
    """Keeps up to ``size`` ready spares per interpreter."""

    def __init__(self, start: Starter, size: int, *, start_spare: Starter | None = None) -> None:
        self._start = start  # a kernel a caller is waiting for
        self._start_spare = start_spare or start  # a spare: may prepare itself further
        self.size = max(0, size)
        self._spares: dict[str, list[ManagedKernel]] = {}
        self._filling: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    async def claim(self, interpreter: str) -> tuple[ManagedKernel, str]:
        """A ready kernel for ``interpreter`` and where it came from ("spare" or "cold")."""
        spares = self._spares.get(interpreter, [])
        while spares:
            kernel = spares.pop(0)
            if await kernel.is_alive():
                self.refill(interpreter)
                return kernel, "spare"
            await kernel.kill()  # died while waiting: replaced below, never handed out
        kernel = await self._start(interpreter)
        self.refill(interpreter)  # no-op while a fill is already running
        return kernel, "cold"

    def refill(self, interpreter: str) -> None:
        """Start spares in the background until ``size`` are ready (no-op when size is 0)."""
        if self._closed or self.size == 0 or interpreter in self._filling:
            return
        task = asyncio.get_running_loop().create_task(self._fill(interpreter))
        self._filling[interpreter] = task
        task.add_done_callback(lambda _t: self._filling.pop(interpreter, None))

    async def _fill(self, interpreter: str) -> None:
        spares = self._spares.setdefault(interpreter, [])
        while not self._closed and len(spares) < self.size:
            started = time.monotonic()
            try:
                kernel = await self._start_spare(interpreter)
            except Exception:
                log.warning("could not start a spare kernel", exc_info=True)
                return  # the next claim starts cold and reports the error itself
            if self._closed:
                await kernel.kill()
                return
            spares.append(kernel)
            log.debug("spare ready in %.0f ms", (time.monotonic() - started) * 1000)

    def all_spares(self) -> list[ManagedKernel]:
        return [k for group in self._spares.values() for k in group]

    @property
    def spare_count(self) -> int:
        return sum(len(s) for s in self._spares.values())

    async def aclose(self) -> None:
        """Stop filling and kill every spare."""
        self._closed = True
        for task in list(self._filling.values()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        spares = [k for group in self._spares.values() for k in group]
        self._spares.clear()
        await asyncio.gather(*(k.kill() for k in spares), return_exceptions=True)
