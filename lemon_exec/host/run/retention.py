"""How long finished background work is kept: ``job_result_ttl_ms`` and ``max_finished_jobs``.

One set of rules for everything that runs in the background and keeps a result for later:
execute_code jobs (:class:`~lemon_exec.host.run.jobs.JobTable`) and the MCP server's
execute_command tasks. A finished item keeps its result until ``job_result_ttl_ms`` after it
ended, and only the newest ``max_finished_jobs`` finished items are kept; then it expires (its
result is dropped) and its id answers "expired" for a while, then "unknown".
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Generic, Protocol, TypeVar

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import JobExpiredError

__all__ = ["EXPIRED", "UNKNOWN", "Kept", "Retention"]

EXPIRED = (
    "{tool}: {noun} {id} has expired: a finished job's result is kept for "
    "job_result_ttl_ms ({ttl} ms) and among the newest max_finished_jobs ({n}) finished jobs, "
    "then dropped."
)
UNKNOWN = "{tool}: no {noun} {id} (never started here, or expired long ago)"
#: How many expired ids are remembered, to answer "expired" rather than "unknown".
_EXPIRED_IDS = 1024


class Kept(Protocol):
    """What the rules need of an item: its id, when it ended, and how to drop its result."""

    @property
    def id(self) -> str: ...

    @property
    def finished_at(self) -> float | None:
        """``time.monotonic()`` when it ended; None while it runs."""
        ...

    def expire(self) -> None: ...


K = TypeVar("K", bound=Kept)


class Retention(Generic[K]):
    """Items by id, in start order: live ones, and finished ones until they expire.

    ``tool`` and ``noun`` name an item in messages ("execute_code: job X has expired").
    """

    def __init__(self, config: ExecuteCodeConfig, tool: str, noun: str) -> None:
        self.config = config
        self._names = {"tool": tool, "noun": noun}
        self._items: OrderedDict[str, K] = OrderedDict()
        self._expired: OrderedDict[str, None] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None  # the next expiry that falls due

    def add(self, item: K) -> None:
        self.prune()
        self._items[item.id] = item

    def get(self, item_id: str) -> K:
        """The item ``item_id``; ``JobExpiredError`` once expired, ``KeyError`` if unknown."""
        self.prune()
        item = self._items.get(item_id)
        if item is not None:
            return item
        if item_id in self._expired:
            raise JobExpiredError(
                EXPIRED.format(
                    **self._names,
                    id=item_id,
                    ttl=self.config.job_result_ttl_ms,
                    n=self.config.max_finished_jobs,
                )
            )
        raise KeyError(UNKNOWN.format(**self._names, id=item_id))

    def list(self) -> list[K]:
        """Live items and finished ones not yet expired, in start order."""
        self.prune()
        return list(self._items.values())

    def ended(self) -> None:
        """An item has ended (call on the loop): apply the rules, time the next expiry."""
        self.prune()
        if self._timer is None:
            self._arm(asyncio.get_running_loop())

    def prune(self) -> None:
        """Expire finished items past ``job_result_ttl_ms`` or beyond ``max_finished_jobs``."""
        finished = sorted(
            (i for i in self._items.values() if i.finished_at is not None),
            key=lambda i: i.finished_at or 0.0,
        )
        ttl_s = self.config.job_result_ttl_ms / 1000
        now = time.monotonic()
        excess = len(finished) - self.config.max_finished_jobs
        for n, item in enumerate(finished):
            if n < excess or now - (item.finished_at or now) >= ttl_s:
                del self._items[item.id]
                item.expire()
                self._expired[item.id] = None
                while len(self._expired) > _EXPIRED_IDS:
                    self._expired.popitem(last=False)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        """Time the next expiry, so a result is dropped when due even if nobody asks.

        One timer, for the oldest finished item; each firing prunes and times the next. On
        the loop only (``call_later`` is not thread-safe): from an item's end and from the
        timer itself, never from ``prune``, which any thread may call.
        """
        ends = [i.finished_at for i in self._items.values() if i.finished_at is not None]
        if not ends or loop.is_closed():
            self._timer = None
            return
        due = min(ends) + self.config.job_result_ttl_ms / 1000
        self._timer = loop.call_later(max(0.0, due - time.monotonic()), self._expire_due, loop)

    def _expire_due(self, loop: asyncio.AbstractEventLoop) -> None:
        self.prune()
        self._arm(loop)
