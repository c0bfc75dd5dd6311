"""Matching the template's replies to the host's fork requests, by id.

Every request carries an id the template echoes in its reply. A request given up on (timed
out, cancelled, or its template retired) is remembered: when its late reply names a kernel,
that kernel is killed. Without the ids a late reply would be taken as the answer to the
next request, handing out a kernel that belongs to nobody (and leaking it).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["Replies"]

Reply = dict[str, Any]


class Replies:
    """The requests of one template awaiting a reply, and those given up on."""

    def __init__(self, kill: Callable[[int], None]) -> None:
        #: Kills a kernel that was forked for a request given up on.
        self._kill = kill
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._abandoned: set[int] = set()
        self._ids = itertools.count(1)

    def open(self) -> tuple[int, asyncio.Future[Reply]]:
        """A new request's id, and the future its reply will be set on."""
        req = next(self._ids)
        waiter: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[req] = waiter
        return req, waiter

    def deliver(self, msg: Reply) -> None:
        """Hand a reply to the request it answers; kill the kernel of one given up on."""
        req = msg.get("req")
        waiter = self._pending.pop(req, None) if isinstance(req, int) else None
        if waiter is not None and not waiter.done():
            waiter.set_result(msg)
        elif req in self._abandoned:
            self._abandoned.discard(req)
            if isinstance(msg.get("pid"), int):
                self._kill(msg["pid"])

    def abandon(self, req: int, waiter: asyncio.Future[Reply]) -> None:
        """Give request ``req`` up: the kernel its reply names, now or later, is killed."""
        self._pending.pop(req, None)
        if not waiter.done():
            self._abandoned.add(req)  # its reply comes late: deliver() kills its kernel
        elif isinstance(waiter.result().get("pid"), int):
            self._kill(waiter.result()["pid"])  # answered just as it was given up

    def abandon_all(self, error: str) -> None:
        """Give every waiting request up; each fails now with ``error``."""
        for req, waiter in list(self._pending.items()):
            self.abandon(req, waiter)
            if not waiter.done():
                waiter.set_result({"error": error})

    def close(self, error: str) -> None:
        """The template is gone: every waiting request fails with ``error``, and none is
        remembered (the template killed its children when it exited)."""
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_result({"error": error})
        self._pending.clear()
        self._abandoned.clear()
