"""A kernel start under the call's deadline and abort signal.

``timeout_ms`` caps the whole call, kernel start included, and an abort ends the call at once
(spec: the deadline and the abort hold from the moment the call is made). A start (a cold
launch, a fork from the template, a wait for a spare, a gateway request) can take longer
than the call has left, so the call waits for it only until its deadline passes or it is
aborted, then leaves with :class:`StartLeft`: nothing of the script ran.

The start itself is cancelled then, in the background: every backend's start cleans up
after itself on cancellation (kills the process it launched, abandons the fork request,
deletes the gateway kernel), and a kernel that was ready in the same instant is handed to
``discard``. The caller never waits for that cleanup; ``spawn`` (the engine's) tracks it so
closing the facade does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from lemon_exec.scope import AbortSignal

T = TypeVar("T")

#: A ``threading.Event`` abort can only be polled: at most this long between two looks.
_POLL_S = 0.05

Spawn = Callable[[Coroutine[Any, Any, Any]], object]


class StartLeft(Exception):
    """The call's deadline passed (``why="timeout"``) or it was aborted (``"cancelled"``)
    while its kernel was starting; the script never ran."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


async def start_within(
    start: Awaitable[T],
    deadline: float,
    abort: AbortSignal | None,
    *,
    spawn: Spawn,
    discard: Callable[[T], Awaitable[None]],
    settled: Callable[[], None] | None = None,
) -> T:
    """``await start``, unless the deadline passes or ``abort`` is set first (StartLeft).

    A start that ends after the deadline (or the abort) counts as too late as well: its
    kernel is discarded, never handed to a script that has no time left. ``settled`` is
    called once an abandoned start has ended and its kernel, if any, is gone (e.g. to free
    the slot the start held); it is not called when the start is used.
    """
    task = asyncio.ensure_future(start)
    abort_wait = asyncio.ensure_future(abort.wait()) if isinstance(abort, asyncio.Event) else None
    try:
        why = await _wait(task, deadline, abort, abort_wait)
    except BaseException:  # the caller went away: the start goes too
        _abandon(task, spawn, discard, settled)
        raise
    finally:
        if abort_wait is not None:
            abort_wait.cancel()
    if why is None:
        return task.result()  # the start's own error, if it failed
    _abandon(task, spawn, discard, settled)
    raise StartLeft(why)


async def _wait(
    task: asyncio.Future[Any],
    deadline: float,
    abort: AbortSignal | None,
    abort_wait: asyncio.Future[Any] | None,
) -> str | None:
    """None once ``task`` is done in time; else ``"cancelled"`` or ``"timeout"``."""
    while True:
        if abort is not None and abort.is_set():
            return "cancelled"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "timeout"
        if task.done():
            return None
        tick = remaining if abort is None or abort_wait is not None else _POLL_S
        waiters: set[asyncio.Future[Any]] = {task}
        if abort_wait is not None:
            waiters.add(abort_wait)
        await asyncio.wait(
            waiters, timeout=min(tick, remaining), return_when=asyncio.FIRST_COMPLETED
        )


def _abandon(
    task: asyncio.Future[T],
    spawn: Spawn,
    discard: Callable[[T], Awaitable[None]],
    settled: Callable[[], None] | None,
) -> None:
    """Cancel the start; in the background, discard a kernel it made all the same."""
    task.cancel()
    spawn(_settle(task, discard, settled))


async def _settle(
    task: asyncio.Future[T],
    discard: Callable[[T], Awaitable[None]],
    settled: Callable[[], None] | None,
) -> None:
    try:
        await asyncio.wait({task})  # never raises: the start's outcome is read below
        if not task.cancelled() and task.exception() is None:
            await discard(task.result())
    finally:
        if settled is not None:
            settled()


__all__ = ["StartLeft", "start_within"]
