"""Session kernels on their way out, counted until their process is confirmed gone.

The cap on live session kernels is strict: a kernel being stopped (timeout, crash, eviction,
reaping, reset, owners gone) counts against ``max_live_kernels`` until its process is gone,
and so does a start given up after its call left (its deadline passed or it was aborted:
``start_race`` undoes it in the background). :class:`Stops` keeps both kinds, retries a stop
that left its kernel running, and lets an admission wait for one of them to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from lemon_exec.host.kernels.backend import KernelHandle
from lemon_exec.host.kernels.engine import Engine
from lemon_exec.host.sessions.queue import QueueLeft
from lemon_exec.scope import AbortSignal

#: A ``threading.Event`` abort can only be polled: at most this long between two looks.
_POLL_S = 0.1


class Stops:
    """Stop attempts (kernel → task) and abandoned starts, until each process is gone."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        #: The task is the stop attempt; True once the process is confirmed gone.
        self._stopping: dict[KernelHandle, asyncio.Task[bool]] = {}
        self._settling: set[asyncio.Future[None]] = set()

    def __len__(self) -> int:
        """Kernels that still count against the cap while they go away."""
        return len(self._stopping) + len(self._settling)

    def pending(self) -> list[asyncio.Future[Any]]:
        """What may still end: stop attempts under way and starts being undone."""
        pending: list[asyncio.Future[Any]] = [
            task for task in self._stopping.values() if not task.done()
        ]
        pending += self._settling
        return pending

    def retire(self, kernel: KernelHandle, reason: str, cells_run: int) -> asyncio.Task[bool]:
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

    async def prune(self) -> None:
        """Forget stop attempts that ended with the process gone."""
        for kernel, task in list(self._stopping.items()):
            if task.done() and not await kernel.is_alive():
                self._stopping.pop(kernel, None)

    def retry_stuck(self) -> None:
        """Try again to stop kernels whose earlier stop attempt left them running."""
        for kernel, task in list(self._stopping.items()):
            if task.done() and not task.cancelled() and task.result() is False:
                self.retire(kernel, "discarded", 0)

    def start_tracker(self) -> tuple[asyncio.Future[None], Callable[[], None]]:
        """A start's settling future and the callback that marks it settled (process gone)."""
        settling: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def settled() -> None:
            self._settling.discard(settling)
            if not settling.done():
                settling.set_result(None)

        return settling, settled

    def count_settling(self, settling: asyncio.Future[None]) -> None:
        """Count a given-up start until it has settled: its process may still be there."""
        if not settling.done():
            self._settling.add(settling)

    @staticmethod
    async def wait_one(
        pending: list[asyncio.Future[Any]], deadline: float, abort: AbortSignal | None
    ) -> None:
        """Wait for one of ``pending`` to end; leave (nothing ran) on deadline or abort."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise QueueLeft("timeout", "capacity")
        if abort is not None and abort.is_set():
            raise QueueLeft("cancelled", "capacity")
        await asyncio.wait(pending, timeout=min(_POLL_S, remaining))
