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

Under bursts (several agents, or one calling back to back) a key's target grows past
``size``: each claim that found no ready spare adds one, up to ``size + max_burst``, and
the extra spares are dropped again once no claim has come up short for ``burst_hold_s``.
Spares start up to ``parallel`` at a time (one per core), and a claim that finds none
ready waits for one already starting (a start that began earlier ends earlier) rather than
starting its own, unless every start in flight is already promised to an earlier claim.
A kernel handed to a waiting claim never ran anything: it is a spare like any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from lemon_exec.host.kernels.backend import KernelHandle

log = logging.getLogger(__name__)

Starter = Callable[[str], Awaitable[KernelHandle]]
Discarder = Callable[[KernelHandle], None]


#: How many spares past ``size`` a key may grow to under a burst of claims.
DEFAULT_MAX_BURST = 3
#: A key's burst spares are dropped once no claim came up short for this long.
DEFAULT_BURST_HOLD_S = 30.0
#: A deferred replacement spare (see KernelPool.claim) starts at the latest this much later.
DEFER_REFILL_S = 1.0
#: After a failed spare start the key tries again this much later, doubling per failure in
#: a row up to RETRY_MAX_S: a template killed mid-start recovers, a broken interpreter
#: does not spin.
RETRY_FIRST_S = 0.25
RETRY_MAX_S = 30.0


@dataclass(frozen=True)
class _Spare:
    kernel: KernelHandle
    #: ``os.environ`` when the kernel started; None if it changed while the kernel started.
    environ: dict[str, str] | None

    def current(self) -> bool:
        return self.environ is not None and self.environ == os.environ


@dataclass
class _Key:
    """One key's spares, starts in flight, waiting claims and burst target."""

    spares: list[_Spare] = field(default_factory=list)
    starting: int = 0
    waiters: list[asyncio.Future[_Spare | None]] = field(default_factory=list)
    extra: int = 0  # burst spares wanted past ``size``
    short_at: float = 0.0  # when a claim last found no ready spare
    deferred: bool = False  # a claimed spare's replacement waits for refill()
    failures: int = 0  # spare starts failed in a row
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


class KernelPool:
    """Keeps ``size`` ready spares per interpreter (more under bursts, see the module doc)."""

    def __init__(
        self,
        start: Starter,
        size: int,
        *,
        start_spare: Starter | None = None,
        discard: Discarder | None = None,
        max_keys: int | None = None,
        max_burst: int = DEFAULT_MAX_BURST,
        burst_hold_s: float = DEFAULT_BURST_HOLD_S,
        parallel: int | None = None,
    ) -> None:
        self._start = start  # a kernel a caller is waiting for
        self._start_spare = start_spare or start  # a spare: may prepare itself further
        self._discard = discard  # stops a live spare that may not be used (default: kill)
        self.size = max(0, size)
        self.max_burst = max(0, max_burst) if self.size else 0
        self.burst_hold_s = burst_hold_s
        self.parallel = max(1, parallel or min(4, _cores()))
        self._keys: dict[str, _Key] = {}
        self._killing: set[asyncio.Task[None]] = set()
        #: Spares discarded at claim because the host's environment had changed.
        self.stale_discarded = 0
        self.max_keys = max_keys
        self._recent: list[str] = []  # keys, least recently used first
        self._trim_handle: asyncio.TimerHandle | None = None
        self._deferred: set[asyncio.TimerHandle] = set()
        self._closed = False

    async def claim(self, interpreter: str, *, defer: bool = False) -> tuple[KernelHandle, str]:
        """A ready kernel for ``interpreter`` and where it came from ("spare" or "cold").

        ``defer``: outside a burst, the replacement spare starts when the caller calls
        :meth:`refill` after its run (at the latest :data:`DEFER_REFILL_S` later), so its
        start does not compete with the run for the CPU; a claim meanwhile starts it at once.
        """
        key = self._key(interpreter)
        first = True
        while True:
            spare = await self._take(key, interpreter, short=first)
            first = False
            if spare is None:
                break
            if not spare.current():
                self.stale_discarded += 1
                self._drop(spare.kernel)  # off the hot path; replaced by the refill below
                continue
            try:
                # A closed link is the surest sign of a killed spare: the reader sees it at
                # once, while the process may not have been reaped yet.
                alive = not spare.kernel.link_ended and await spare.kernel.is_alive()
            except asyncio.CancelledError:  # the claim was given up: the spare stays one
                key.spares.insert(0, spare)
                raise
            if alive:
                if defer and not key.extra and not key.waiters:
                    self._defer_refill(interpreter, key)
                else:
                    self.refill(interpreter)
                return spare.kernel, "spare"
            await spare.kernel.kill()  # died while waiting: replaced below, never handed out
        kernel = await self._start(interpreter)
        self.refill(interpreter)
        return kernel, "cold"

    async def _take(self, key: _Key, interpreter: str, *, short: bool) -> _Spare | None:
        """A ready spare, or one that is starting; None: start a kernel of one's own.

        ``short``: finding none ready while one is starting means demand outruns the spares
        (not so after a stale or dead spare was skipped), so the key's target grows.
        """
        if key.spares:
            return key.spares.pop(0)
        if self.size == 0 or self._closed:
            return None
        if short and (key.starting or key.deferred):  # not before the first spare started
            key.short_at = time.monotonic()
            key.extra = min(self.max_burst, key.extra + 1)
            self._schedule_trim()
        unpromised = key.starting - len(key.waiters)
        if unpromised <= 0:
            self.refill(interpreter)
            return None
        waiter: asyncio.Future[_Spare | None] = asyncio.get_running_loop().create_future()
        key.waiters.append(waiter)
        self.refill(interpreter)
        try:
            return await waiter  # None: that start failed, or the pool closed
        except BaseException:
            if waiter in key.waiters:
                key.waiters.remove(waiter)
            elif waiter.done() and not waiter.cancelled():
                handed = waiter.result()
                if handed is not None:  # handed over just as we gave up: keep it
                    key.spares.insert(0, handed)
            raise

    def refill(self, interpreter: str) -> None:
        """Start spares in the background up to the key's target (no-op when size is 0)."""
        if self._closed or self.size == 0:
            return
        self._touch(interpreter)
        key = self._key(interpreter)
        key.deferred = False
        loop = asyncio.get_running_loop()
        while self._wanted(interpreter) and key.starting < self.parallel:
            have = len(key.spares) + key.starting - len(key.waiters)
            if have >= self.size + key.extra:
                return
            key.starting += 1
            task = loop.create_task(self._start_one(interpreter, key))
            key.tasks.add(task)
            task.add_done_callback(key.tasks.discard)

    def _defer_refill(self, interpreter: str, key: _Key) -> None:
        key.deferred = True
        self._call_later(DEFER_REFILL_S, interpreter)

    def _retry_later(self, interpreter: str, key: _Key) -> None:
        key.failures += 1
        if self._closed or key.starting:
            return  # a start still in flight refills when it ends
        delay = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (key.failures - 1))
        self._call_later(delay, interpreter)

    def _call_later(self, delay: float, interpreter: str) -> None:
        loop = asyncio.get_running_loop()
        handle = loop.call_later(delay, self.refill, interpreter)
        self._deferred.add(handle)
        loop.call_later(delay + 0.1, self._deferred.discard, handle)

    def _key(self, interpreter: str) -> _Key:
        key = self._keys.get(interpreter)
        if key is None:
            key = self._keys[interpreter] = _Key()
        return key

    def _touch(self, key: str) -> None:
        """Mark ``key`` most recently used; past ``max_keys``, drop the oldest key's spares."""
        if key in self._recent:
            self._recent.remove(key)
        self._recent.append(key)
        while self.max_keys is not None and len(self._recent) > self.max_keys:
            old = self._recent.pop(0)
            state = self._keys.get(old)
            if state is None:
                continue
            for spare in state.spares:
                self._drop(spare.kernel)  # a start still running for it stops by itself
            state.spares.clear()
            if not state.starting and not state.waiters:
                self._keys.pop(old, None)

    def _wanted(self, key: str) -> bool:
        return not self._closed and (self.max_keys is None or key in self._recent)

    async def _start_one(self, interpreter: str, key: _Key) -> None:
        started = time.monotonic()
        before = dict(os.environ)
        try:
            kernel = await self._start_spare(interpreter)
        except Exception:
            log.warning("could not start a spare kernel", exc_info=True)
            key.starting -= 1
            # A claim waiting for it starts its own and reports the error itself.
            self._hand_over(key, None)
            self._retry_later(interpreter, key)
            return
        except BaseException:
            key.starting -= 1
            self._hand_over(key, None)
            raise
        key.starting -= 1
        key.failures = 0
        if self._closed:
            self._hand_over(key, None)
            await kernel.kill()
            return
        # Which environment the kernel got is known only if it did not change meanwhile.
        spare = _Spare(kernel, before if before == os.environ else None)
        log.debug("spare ready in %.0f ms", (time.monotonic() - started) * 1000)
        if self._hand_over(key, spare):
            self.refill(interpreter)
            return
        if not self._wanted(interpreter) or len(key.spares) >= self.size + key.extra:
            self._drop(kernel)  # its key was dropped, or its burst ended, while it started
            return
        key.spares.append(spare)
        self.refill(interpreter)

    def _hand_over(self, key: _Key, spare: _Spare | None) -> bool:
        """Give ``spare`` to the longest-waiting claim (None wakes one to start its own)."""
        while key.waiters:
            waiter = key.waiters.pop(0)
            if not waiter.done():
                waiter.set_result(spare)
                return True
        return False

    def _schedule_trim(self) -> None:
        if self._trim_handle is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._trim_handle = loop.call_later(self.burst_hold_s, self._trim)

    def _trim(self) -> None:
        """Drop burst spares of keys that have not come up short for ``burst_hold_s``."""
        self._trim_handle = None
        now = time.monotonic()
        pending = False
        for key in self._keys.values():
            if not key.extra:
                continue
            if now - key.short_at < self.burst_hold_s:
                pending = True
                continue
            key.extra = 0
            while len(key.spares) > self.size:
                self._drop(key.spares.pop().kernel)
        if pending:
            self._schedule_trim()

    def _drop(self, kernel: KernelHandle) -> None:
        if self._discard is not None:
            self._discard(kernel)
            return
        task = asyncio.get_running_loop().create_task(kernel.kill())
        self._killing.add(task)
        task.add_done_callback(self._killing.discard)

    def all_spares(self) -> list[KernelHandle]:
        return [s.kernel for key in self._keys.values() for s in key.spares]

    @property
    def spare_count(self) -> int:
        return sum(len(key.spares) for key in self._keys.values())

    @property
    def starting(self) -> int:
        """Spares starting now (their processes exist; they are not handed out yet)."""
        return sum(key.starting for key in self._keys.values())

    async def aclose(self) -> None:
        """Stop starting spares, wake waiting claims and kill every spare."""
        self._closed = True
        if self._trim_handle is not None:
            self._trim_handle.cancel()
            self._trim_handle = None
        for handle in self._deferred:
            handle.cancel()
        self._deferred.clear()
        tasks = [t for key in self._keys.values() for t in key.tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for key in self._keys.values():
            self._hand_over(key, None)
        spares = self.all_spares()
        for key in self._keys.values():
            key.spares.clear()
        await asyncio.gather(*(k.kill() for k in spares), return_exceptions=True)
        await asyncio.gather(*list(self._killing), return_exceptions=True)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
