"""The disk worker: one thread that does a host's filesystem work, in order, off the loop.

Creating and removing a run's workspace, rewriting the kernel index and removing the staging
root are a few system calls each, but on a slow or loaded disk one of them can take tens of
milliseconds, and on the event loop that stalls every other caller of the host. They run
here instead, on one thread, first come first served (the order is the order of
submission, so a write never overtakes an earlier one).

- :meth:`DiskWorker.call` runs a function there and awaits its result (a workspace the run
  needs before it starts);
- :meth:`DiskWorker.settle` runs cleanup the caller waits for but never fails on (removing a
  finished run's workspace before its result is returned: no file outlives its run), and
  which the caller's cancellation does not undo;
- :meth:`DiskWorker.later` queues work nobody waits for (rewriting the index): it may lag,
  but it is done before :meth:`drain` returns, which closing the host awaits before it
  removes the staging root.

The thread starts with the first job and has ended when :meth:`aclose` returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class DiskWorker:
    """One host's filesystem work, on one thread, in submission order."""

    def __init__(self) -> None:
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="lemon-exec-disk"
        )
        self._closed = False

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the worker thread and return its result (or raise its error).

        After :meth:`close` (an exit-time cleanup) it runs inline instead.
        """
        if self._closed:
            return fn(*args)
        return await asyncio.wrap_future(self._executor.submit(fn, *args))

    async def settle(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` and wait for it; an error is logged, not raised.

        Cancelling the caller does not cancel the work: it still runs, in its turn.
        """
        if self._closed:
            _logged(fn, *args)
            return
        await asyncio.shield(asyncio.wrap_future(self._executor.submit(_logged, fn, *args)))

    def later(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; nobody waits for it, an error is logged. Done by :meth:`drain`."""
        if self._closed:
            _logged(fn, *args)
            return
        self._executor.submit(_logged, fn, *args)

    async def drain(self) -> None:
        """Wait until everything queued so far is done."""
        if not self._closed:
            await asyncio.wrap_future(self._executor.submit(_nothing))

    async def aclose(self, final: Callable[[], Any] | None = None) -> None:
        """Drain, run ``final`` (the last job, e.g. removing the staging root), and stop."""
        if self._closed:
            if final is not None:
                final()
            return
        try:
            await asyncio.wrap_future(self._executor.submit(_nothing if final is None else final))
        finally:
            self._closed = True
            # Its queue is empty: the idle thread ends at once, and none is left behind.
            self._executor.shutdown(wait=True)

    def close(self) -> None:
        """Stop the thread once its queue is done, without waiting (exit-time cleanup)."""
        self._closed = True
        self._executor.shutdown(wait=False)


def _nothing() -> None:
    return None


def _logged(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        log.warning("execute_code: background file work failed", exc_info=True)


__all__ = ["DiskWorker"]
