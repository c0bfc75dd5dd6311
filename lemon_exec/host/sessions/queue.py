"""The FIFO queue in front of one session kernel: one active cell, the rest wait in order.

A caller takes a :class:`Ticket` with :func:`acquire` and gives it back with
:func:`release`, which hands the kernel straight to the next waiter. A waiter leaves
(nothing ran) when its deadline passes or it is aborted (:class:`QueueLeft`), or when its
owner is closed meanwhile (:class:`OwnerGone`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from lemon_exec.errors import SessionBusyError
from lemon_exec.scope import AbortSignal

#: A ``threading.Event`` abort can only be polled: at most this long between two looks.
_POLL_S = 0.1


class OwnerGone(Exception):
    """The owner was closed while its call waited in the queue."""


class QueueLeft(Exception):
    """A call left before it started: its deadline passed or it was aborted while it waited
    in the session queue (``where="queue"``), for a kernel slot (``"capacity"``) or for its
    kernel to start (``"start"``)."""

    def __init__(self, why: str, where: str = "queue") -> None:
        super().__init__(why)
        self.why = why
        self.where = where


@dataclass
class Ticket:
    owner_id: int
    granted: asyncio.Future[None]
    abort: asyncio.Event = field(default_factory=asyncio.Event)
    started: float = 0.0  # time.monotonic() when it became the active cell


class Queued(Protocol):
    """What the queue needs of a session kernel entry."""

    queue: deque[Ticket]
    active: Ticket | None


async def acquire(
    entry: Queued, owner_id: int, deadline: float, abort: AbortSignal | None, max_queued: int
) -> Ticket:
    """The active place on ``entry``, at once or after the calls queued before this one.

    Raises ``SessionBusyError`` when ``max_queued`` calls already wait.
    """
    loop = asyncio.get_running_loop()
    ticket = Ticket(owner_id, loop.create_future())
    if entry.active is None and not entry.queue:
        entry.active = ticket
        ticket.granted.set_result(None)
        ticket.started = time.monotonic()
        return ticket
    if len(entry.queue) >= max_queued:
        raise SessionBusyError(
            f"execute_code: this session's kernel is busy ({len(entry.queue)} calls already "
            f"queued, max_queued_cells_per_kernel = {max_queued}); wait for them and retry"
        )
    entry.queue.append(ticket)
    abort_task = asyncio.ensure_future(abort.wait()) if isinstance(abort, asyncio.Event) else None
    try:
        while not ticket.granted.done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise QueueLeft("timeout")
            waiters: set[asyncio.Future[Any]] = {ticket.granted}
            if abort_task is not None:
                waiters.add(abort_task)
            await asyncio.wait(
                waiters, timeout=min(_POLL_S, remaining), return_when=asyncio.FIRST_COMPLETED
            )
            if ticket.granted.done():
                break
            if abort is not None and abort.is_set():
                raise QueueLeft("cancelled")
        ticket.granted.result()  # raises OwnerGone if the owner was closed meanwhile
    except BaseException:
        if ticket in entry.queue:
            entry.queue.remove(ticket)
        elif entry.active is ticket:  # granted in the same instant we gave up
            release(entry, ticket)
        raise
    finally:
        if abort_task is not None:
            abort_task.cancel()
    ticket.started = time.monotonic()
    return ticket


def release(entry: Queued, ticket: Ticket) -> bool:
    """Give back ``ticket``'s place; True when the entry is left with no cell at all."""
    if entry.active is not ticket:
        return False
    entry.active = None
    while entry.queue:
        nxt = entry.queue.popleft()
        if not nxt.granted.done():
            entry.active = nxt
            nxt.granted.set_result(None)
            return False
    return True


def remove_owner(entry: Queued, owner_id: int) -> None:
    """Take the owner's waiting calls out (each learns :class:`OwnerGone`)."""
    for ticket in list(entry.queue):
        if ticket.owner_id == owner_id:
            entry.queue.remove(ticket)
            if not ticket.granted.done():
                ticket.granted.set_exception(OwnerGone())


def close(entry: Queued) -> None:
    """Turn every waiter away and abort the active cell (the registry is closing)."""
    for ticket in list(entry.queue):
        if not ticket.granted.done():
            ticket.granted.set_exception(OwnerGone())
    entry.queue.clear()
    if entry.active is not None:
        entry.active.abort.set()
