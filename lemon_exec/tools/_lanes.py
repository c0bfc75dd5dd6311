"""Thread lanes: a small pool of daemon threads per tool kind.

Sync tools used to share the event loop's default executor (6 threads on 2 cores): six stuck
calls of one tool (say, slow web fetches) starved every other tool, and every other user of
that executor. A lane serves one kind of tool only, so a wedged kind can exhaust only its own
lane. Threads are daemons (a stuck one never blocks interpreter exit) and are reused; a lane
never runs more than ``max_threads`` jobs at once, and queued jobs whose future was cancelled
are dropped without running.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DEFAULT_LANE_THREADS", "ThreadLane"]

T = TypeVar("T")

#: Threads per lane.
DEFAULT_LANE_THREADS = 8
#: An idle thread exits after this many seconds without work.
IDLE_EXIT_S = 60.0

_Job = tuple["concurrent.futures.Future[Any]", Callable[..., Any], tuple[Any, ...]]


class ThreadLane:
    """Runs blocking callables on at most ``max_threads`` daemon threads named ``name-N``."""

    def __init__(self, name: str, max_threads: int = DEFAULT_LANE_THREADS) -> None:
        if max_threads < 1:
            raise ValueError("max_threads must be >= 1")
        self.name = name
        self._max = max_threads
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._queued = 0
        self._serial = 0
        self._closed = False

    @property
    def threads(self) -> int:
        """Threads currently alive in this lane."""
        return self._threads

    def submit(self, fn: Callable[..., T], *args: Any) -> concurrent.futures.Future[T]:
        """Queue ``fn(*args)``; start a thread if none is free and the lane has room."""
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError(f"thread lane {self.name} is closed")
            self._queued += 1
            start = self._queued > self._idle and self._threads < self._max
            if start:
                self._threads += 1
                self._serial += 1
                serial = self._serial
        self._jobs.put((fut, fn, args))
        if start:
            threading.Thread(target=self._serve, name=f"{self.name}-{serial}", daemon=True).start()
        return fut

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Await ``fn(*args)`` on the lane; cancelling stops waiting (a running call goes on)."""
        return await asyncio.wrap_future(self.submit(fn, *args))

    def close(self) -> None:
        """Let the threads exit once the queued jobs are done. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            count = self._threads
        for _ in range(count):
            self._jobs.put(None)

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            try:
                job = self._jobs.get(timeout=IDLE_EXIT_S)
            except queue.Empty:
                job = None
                with self._lock:
                    # Exit only if no job slipped in meanwhile; otherwise serve it.
                    if self._queued <= self._idle - 1:
                        self._idle -= 1
                        self._threads -= 1
                        return
                job = self._jobs.get()
            with self._lock:
                self._idle -= 1
                if job is not None:
                    self._queued -= 1
            if job is None:
                with self._lock:
                    self._threads -= 1
                return
            fut, fn, args = job
            if not fut.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                result = fn(*args)
            except BaseException as e:
                fut.set_exception(e)
            else:
                fut.set_result(result)
            del fut, fn, args, job  # drop references before idling
