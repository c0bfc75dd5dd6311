"""Job: the public handle on a script run in the background (``ExecuteCode.start``).

The job itself (its state, live buffer and result) lives with the runner
(:class:`lemon_exec.host.run.jobs.JobRun`); a :class:`Job` is a view on it with the sync
twins of its coroutines, driven by the facade's loop thread as ``run_sync`` is. Two handles
on one job are equal. See docs/jobs.md.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from lemon_exec.host.run.jobs import JobPoll, JobRun, JobState
from lemon_exec.result import ExecuteCodeResult

__all__ = ["Job", "JobPoll", "JobState"]

SyncCall = Callable[[Coroutine[Any, Any, Any]], Any]


class Job:
    """A script running as a job: it outlives the call that started it.

    ``state`` is ``queued`` (waiting for a slot, its session's queue or its kernel),
    ``running``, then ``completed``, ``failed``, ``cancelled`` or ``timed_out`` (its
    ``max_job_ms`` deadline, or its own ``timeout_ms``); ``expired`` once its result is no
    longer kept. ``await wait()`` gives the same :class:`ExecuteCodeResult` a ``run()``
    gives; ``poll(cursor)`` what it printed, notified and returned with ``text()`` since the
    cursor; ``await cancel()`` stops it (a queued job leaves its queue; nothing ran).
    """

    def __init__(self, run: JobRun, call_sync: SyncCall) -> None:
        self._run = run
        self._call_sync = call_sync

    @property
    def id(self) -> str:
        return self._run.id

    @property
    def state(self) -> JobState:
        return self._run.state

    @property
    def done(self) -> bool:
        """True once the job has ended (any state but ``queued`` and ``running``)."""
        return self._run.done

    @property
    def result(self) -> ExecuteCodeResult | None:
        """The result once finished; None before, and once expired."""
        return self._run.result

    @property
    def created(self) -> float:
        """When the job was started (``time.time()``)."""
        return self._run.created

    def poll(self, cursor: int = 0) -> JobPoll:
        """Output, notify() updates and text() blocks since ``cursor``; non-blocking.

        Pass the returned ``cursor`` to the next poll. ``JobExpiredError`` once expired.
        """
        return self._run.poll(cursor)

    async def wait(self, timeout: float | None = None) -> ExecuteCodeResult:
        """The job's result once it ends.

        ``timeout`` (seconds): ``TimeoutError`` if it has not ended by then; the job runs on.
        ``JobExpiredError`` once expired.
        """
        return await self._run.wait(timeout)

    async def cancel(self) -> ExecuteCodeResult | None:
        """Stop the job and return its result (``cancelled``, or how it had already ended).

        A running script is interrupted as an aborted call is: partial output is kept, and in
        session mode its kernel is discarded (``state_retained: false``).
        """
        return await self._run.cancel()

    def wait_sync(self, timeout: float | None = None) -> ExecuteCodeResult:
        """Blocking twin of :meth:`wait` (for a job from ``start_sync``)."""
        result: ExecuteCodeResult = self._call_sync(self._run.wait(timeout))
        return result

    def cancel_sync(self) -> ExecuteCodeResult | None:
        """Blocking twin of :meth:`cancel`."""
        result: ExecuteCodeResult | None = self._call_sync(self._run.cancel())
        return result

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other._run is self._run

    def __hash__(self) -> int:
        return hash(self._run.id)

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.state}>"
