"""Admission control for per-call runs: a cap on kernels at once and a bounded FIFO queue.

Without it, N concurrent calls start N kernels at once: on a small machine a burst of 120
calls starved the kernel starts until they timed out. A slot is held from before the kernel
is claimed until that kernel is confirmed stopped, so the cap bounds live per-call kernels
(warm spares come on top; they are bounded by ``warm_kernels``). A caller that finds the
queue full, or whose deadline passes while it waits, gets a busy answer instead of a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from lemon_exec.scope import AbortSignal

__all__ = ["Admission", "Denied", "Slot", "default_limit"]

#: How often a waiter polls a ``threading.Event`` abort (asyncio events are awaited).
_ABORT_POLL_S = 0.05


def default_limit(cores: int | None = None, available_bytes: int | None = None) -> int:
    """``max(2, min(4 x cores, 8 x available GiB))``; memory is left out when unknown."""
    cores = cores if cores is not None else _cores()
    available = available_bytes if available_bytes is not None else _available_memory()
    by_cpu = 4 * max(1, cores)
    if available is None:
        return max(2, by_cpu)
    return max(2, min(by_cpu, int(available / 2**30 * 8)))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo, in bytes (None off Linux or when unreadable)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Slot:
    """A granted place among the running per-call kernels; release it exactly once."""

    admission: Admission
    waited_ms: int
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission._release()


@dataclass(frozen=True)
class Denied:
    """Why a caller got no slot: ``queue_full``, ``queue_timeout``, ``cancelled`` or ``closed``."""

    reason: str
    running: int
    waiting: int
    waited_ms: int


class Admission:
    """At most ``limit`` holders at once; up to ``queue`` more wait in FIFO order."""

    def __init__(self, limit: int, queue: int) -> None:
        self.limit = max(1, limit)
        self.queue = max(0, queue)
        self.running = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, deadline: float, abort: AbortSignal | None = None) -> Slot | Denied:
        """A slot, or a :class:`Denied` once the queue is full, the deadline passes or abort."""
        started = time.monotonic()
        if self._closed:
            return self._denied("closed", started)
        if self.running < self.limit and not self._waiters:
            self.running += 1
            return Slot(self, 0)
        if len(self._waiters) >= self.queue:
            return self._denied("queue_full", started)
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(granted)
        try:
            why = await _wait(granted, deadline, abort)
        except BaseException:  # the caller died: give a slot it was just handed back
            self._leave(granted)
            raise
        if why is None:
            return Slot(self, int((time.monotonic() - started) * 1000))
        self._leave(granted)
        return self._denied(why, started)

    def _denied(self, reason: str, started: float) -> Denied:
        waited = int((time.monotonic() - started) * 1000)
        return Denied(reason, self.running, len(self._waiters), waited)

    def _leave(self, granted: asyncio.Future[None]) -> None:
        """Take a waiter out of the queue; a slot already handed to it goes to the next one."""
        if granted.done() and not granted.cancelled() and granted.exception() is None:
            self._release()
            return
        granted.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(granted)

    def _release(self) -> None:
        # Hand the slot straight to the oldest waiter, so a newcomer cannot overtake the queue.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.running -= 1

    def close(self) -> None:
        """Turn every waiter away (the tool is shutting down); holders release as usual."""
        self._closed = True
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(_Closed())


class _Closed(Exception):
    pass


async def _wait(
    granted: asyncio.Future[None], deadline: float, abort: AbortSignal | None
) -> str | None:
    """None once ``granted`` resolves; else ``queue_timeout``, ``cancelled`` or ``closed``."""
    abort_wait = asyncio.ensure_future(abort.wait()) if isinstance(abort, asyncio.Event) else None
    try:
        while True:
            if granted.done():
                return "closed" if granted.exception() is not None else None
            if abort is not None and abort.is_set():
                return "cancelled"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "queue_timeout"
            tick = remaining if abort is None or abort_wait is not None else _ABORT_POLL_S
            waiters: set[asyncio.Future[Any]] = {granted}
            if abort_wait is not None:
                waiters.add(abort_wait)
            await asyncio.wait(
                waiters,
                timeout=min(tick, remaining),
                return_when=asyncio.FIRST_COMPLETED,
            )
    finally:
        if abort_wait is not None:
            abort_wait.cancel()
