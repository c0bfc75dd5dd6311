"""Warm spares for per-call runs: kernels started ahead of time, each used exactly once.

A cold kernel start costs ~50x a bare ``python3`` start, so per-call mode claims a spare
that is already running and refills in the background. A claimed kernel is never returned
to the pool; a spare that died is replaced, never handed out.

A spare inherited the host's environment when it started, so each remembers a snapshot of
``os.environ`` from then; one whose snapshot differs from ``os.environ`` at claim (the host
set, changed or removed a variable meanwhile) is stale and discarded, never handed out.
Comparing the two dicts costs a few microseconds per claim; a discard costs a cold start
for that one call.

Spares are kept per key. The key is the interpreter, plus, for sandboxed kernels, the working
directory their sandbox shows (fixed when the kernel starts). With ``max_keys`` set, only the
spares of that many most recently used keys are kept, so an agent that moves between many
directories does not leave a spare behind in each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lemon_exec.host.backend import KernelHandle

log = logging.getLogger(__name__)

Starter = Callable[[str], Awaitable[KernelHandle]]
Discarder = Callable[[KernelHandle], None]


@dataclass(frozen=True)
class _Spare:
    kernel: KernelHandle
    #: ``os.environ`` when the kernel started; None if it changed while the kernel started.
    environ: dict[str, str] | None

    def current(self) -> bool:
        return self.environ is not None and self.environ == os.environ


class KernelPool:
    """Keeps up to ``size`` ready spares per interpreter."""

    def __init__(
        self,
        start: Starter,
        size: int,
        *,
        start_spare: Starter | None = None,
        discard: Discarder | None = None,
        max_keys: int | None = None,
    ) -> None:
        self._start = start  # a kernel a caller is waiting for
        self._start_spare = start_spare or start  # a spare: may prepare itself further
        self._discard = discard  # stops a live spare that may not be used (default: kill)
        self.size = max(0, size)
        self._spares: dict[str, list[_Spare]] = {}
        self._killing: set[asyncio.Task[None]] = set()
        #: Spares discarded at claim because the host's environment had changed.
        self.stale_discarded = 0
        self._filling: dict[str, asyncio.Task[None]] = {}
        self.max_keys = max_keys
        self._recent: list[str] = []  # keys, least recently used first
        self._closed = False

    async def claim(self, interpreter: str) -> tuple[KernelHandle, str]:
        """A ready kernel for ``interpreter`` and where it came from ("spare" or "cold")."""
        spares = self._spares.get(interpreter, [])
        while spares:
            spare = spares.pop(0)
            if not spare.current():
                self.stale_discarded += 1
                self._drop(spare.kernel)  # off the hot path; replaced by the refill below
                continue
            if await spare.kernel.is_alive():
                self.refill(interpreter)
                return spare.kernel, "spare"
            await spare.kernel.kill()  # died while waiting: replaced below, never handed out
        kernel = await self._start(interpreter)
        self.refill(interpreter)  # no-op while a fill is already running
        return kernel, "cold"

    def refill(self, interpreter: str) -> None:
        """Start spares in the background until ``size`` are ready (no-op when size is 0)."""
        if self._closed or self.size == 0:
            return
        self._touch(interpreter)
        if interpreter in self._filling:
            return
        task = asyncio.get_running_loop().create_task(self._fill(interpreter))
        self._filling[interpreter] = task
        task.add_done_callback(lambda _t: self._filling.pop(interpreter, None))

    def _touch(self, key: str) -> None:
        """Mark ``key`` most recently used; past ``max_keys``, drop the oldest key's spares."""
        if key in self._recent:
            self._recent.remove(key)
        self._recent.append(key)
        while self.max_keys is not None and len(self._recent) > self.max_keys:
            old = self._recent.pop(0)
            for spare in self._spares.pop(old, []):
                self._drop(spare.kernel)  # a fill still running for it stops by itself

    def _wanted(self, key: str) -> bool:
        return not self._closed and (self.max_keys is None or key in self._recent)

    async def _fill(self, interpreter: str) -> None:
        while self._wanted(interpreter):
            spares = self._spares.setdefault(interpreter, [])
            if len(spares) >= self.size:
                return
            started = time.monotonic()
            before = dict(os.environ)
            try:
                kernel = await self._start_spare(interpreter)
            except Exception:
                log.warning("could not start a spare kernel", exc_info=True)
                return  # the next claim starts cold and reports the error itself
            if self._closed:
                await kernel.kill()
                return
            if not self._wanted(interpreter):  # its key was dropped while it started
                self._spares.pop(interpreter, None)
                self._drop(kernel)
                return
            spares = self._spares.setdefault(interpreter, [])
            # Which environment the kernel got is known only if it did not change meanwhile.
            spares.append(_Spare(kernel, before if before == os.environ else None))
            log.debug("spare ready in %.0f ms", (time.monotonic() - started) * 1000)

    def _drop(self, kernel: KernelHandle) -> None:
        if self._discard is not None:
            self._discard(kernel)
            return
        task = asyncio.get_running_loop().create_task(kernel.kill())
        self._killing.add(task)
        task.add_done_callback(self._killing.discard)

    def all_spares(self) -> list[KernelHandle]:
        return [s.kernel for group in self._spares.values() for s in group]

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
        spares = self.all_spares()
        self._spares.clear()
        await asyncio.gather(*(k.kill() for k in spares), return_exceptions=True)
        await asyncio.gather(*list(self._killing), return_exceptions=True)
