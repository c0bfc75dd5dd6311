"""Jobs: calls that outlive the caller's ``await`` (``ExecuteCode.start``).

A job is one call made through the runner (:meth:`~lemon_exec.host.run.runner.Runner.run`),
the one way a call runs, but run as a task on the runner's loop instead of being awaited by
its caller: admission, the session queue, ``max_live_kernels`` and every budget of a run apply
unchanged. Its deadline is ``max_job_ms`` instead of ``timeout_ms`` (``CallArgs.job``).

The job tees the call's live output, ``notify()`` messages and ``text()`` blocks into a
bounded buffer that :meth:`JobRun.poll` reads from a cursor; the call's ``on_start`` hook
(sent to the kernel) turns it from ``queued`` to ``running``. :meth:`JobRun.cancel` sets the
abort the call was given, so a queued job leaves its queue and a running one is interrupted,
exactly as an aborted call. A finished job keeps its result for ``job_result_ttl_ms`` and
among the newest ``max_finished_jobs``, then expires: its result is dropped
(:mod:`~lemon_exec.host.run.retention`, the rules the MCP server's shell tasks share).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.details import outcome_of
from lemon_exec.errors import JobExpiredError
from lemon_exec.host.run.calls import CallArgs, Listener, base_details
from lemon_exec.host.run.results import refusal
from lemon_exec.host.run.retention import Retention
from lemon_exec.result import ExecuteCodeResult

log = logging.getLogger(__name__)

JobState = Literal["queued", "running", "completed", "failed", "cancelled", "timed_out", "expired"]
#: The states of a job that has ended (``expired``: ended, and its result dropped since).
FINISHED: frozenset[str] = frozenset({"completed", "failed", "cancelled", "timed_out", "expired"})
_STATE_OF_OUTCOME: dict[str, JobState] = {
    "ok": "completed",
    "timeout": "timed_out",
    "cancelled": "cancelled",
}
CANCELLED_BEFORE_START = (
    "Script cancelled.\n\nThe job was cancelled before it started; nothing ran."
)
#: How long host shutdown waits for cancelled jobs to end before it stops their kernels.
CANCEL_GRACE_S = 10.0

RunCall = Callable[[CallArgs, Any], Awaitable[ExecuteCodeResult]]
Event = tuple[int, str, str]  # (sequence number, kind: output | notify | text, text)


def new_task_id() -> str:
    """A job's or shell task's id: 24 hex digits (96 random bits).

    Hex, so that an id pasted on a command line (``lemon-exec jobs show ID``) is never read
    as an option, as one starting with ``-`` would be, and needs no quoting in a shell.
    """
    return secrets.token_hex(12)


@dataclass(frozen=True)
class JobPoll:
    """What a job did since a cursor (:meth:`JobRun.poll`); pass ``cursor`` to the next poll.

    ``output``: the printed output (stdout and stderr, merged) since the cursor;
    ``notifications``: the ``notify()`` updates; ``text_blocks``: the ``text()`` blocks.
    ``missed``: some output between the cursor and what is kept was dropped (the buffer holds
    at most ``max_output_bytes`` of output; the result still has it as a run's does).
    ``result``: the job's result once it has finished.
    """

    job_id: str
    state: JobState
    cursor: int
    output: str = ""
    notifications: list[str] = field(default_factory=list)
    text_blocks: list[str] = field(default_factory=list)
    missed: bool = False
    result: ExecuteCodeResult | None = None


class JobRun:
    """One job's state, buffer and result (the public handle is ``lemon_exec.jobs.Job``)."""

    def __init__(self, job_id: str, max_buffer_bytes: int) -> None:
        self.id = job_id
        self.state: JobState = "queued"
        self.abort = asyncio.Event()  # the call's abort: cancel() sets it
        self.created = time.time()
        self.finished_at: float | None = None  # time.monotonic() when it ended
        self.result: ExecuteCodeResult | None = None
        self.task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self._events: deque[Event] = deque()
        self._next_seq = 0
        self._output_bytes = 0
        self._max_buffer = max_buffer_bytes

    @property
    def done(self) -> bool:
        return self.state in FINISHED

    # -- feeding -------------------------------------------------------------------------------

    def started(self) -> None:
        if self.state == "queued":
            self.state = "running"

    def add(self, kind: str, text: str) -> None:
        """One live event; the oldest are dropped past ``max_buffer_bytes`` of output."""
        self._events.append((self._next_seq, kind, text))
        self._next_seq += 1
        if kind == "output":
            self._output_bytes += len(text.encode("utf-8", "surrogatepass"))
        while self._output_bytes > self._max_buffer and len(self._events) > 1:
            _, old_kind, old = self._events.popleft()
            if old_kind == "output":
                self._output_bytes -= len(old.encode("utf-8", "surrogatepass"))

    def tee(self, kind: str, listener: Listener | None) -> Listener:
        def listen(text: str) -> None:
            self.add(kind, text)
            if listener is not None:
                listener(text)

        return listen

    def finish(self, result: ExecuteCodeResult) -> None:
        self.result = result
        self.state = _STATE_OF_OUTCOME.get(outcome_of(result.details), "failed")
        self.finished_at = time.monotonic()
        self._done.set()

    def expire(self) -> None:
        """Drop the result and buffer: the job is ``expired``."""
        self.state = "expired"
        self.result = None
        self._events.clear()
        self._output_bytes = 0

    # -- reading -------------------------------------------------------------------------------

    def poll(self, cursor: int = 0) -> JobPoll:
        """Everything since ``cursor`` (0: from the start). Safe from any thread."""
        if self.state == "expired":
            raise JobExpiredError(f"execute_code: job {self.id} has expired")
        state, result = self.state, self.result  # read first: no event can follow a result
        events = list(self._events)  # one C-level copy: atomic under the GIL
        first = events[0][0] if events else self._next_seq
        output: list[str] = []
        notes: list[str] = []
        blocks: list[str] = []
        last = cursor
        for seq, kind, text in events:
            if seq < cursor:
                continue
            (output if kind == "output" else notes if kind == "notify" else blocks).append(text)
            last = seq + 1
        missed = cursor < first  # events after the cursor were dropped
        return JobPoll(
            self.id, state, max(last, cursor), "".join(output), notes, blocks, missed, result
        )

    async def wait(self, timeout: float | None = None) -> ExecuteCodeResult:
        """The result once the job ends; ``TimeoutError`` after ``timeout`` s (it runs on)."""
        if not self._done.is_set():
            await asyncio.wait_for(self._done.wait(), timeout)
        if self.result is None:
            raise JobExpiredError(f"execute_code: job {self.id} has expired")
        return self.result

    async def cancel(self) -> ExecuteCodeResult | None:
        """Stop the job (a queued one leaves its queue) and return its result.

        A job that has already ended keeps its result; None once it has expired.
        """
        if not self._done.is_set():
            self.abort.set()
            await self._done.wait()
        return self.result


class JobTable:
    """The jobs of one runner: live ones, and finished ones until they expire."""

    def __init__(self, config: ExecuteCodeConfig, run: RunCall) -> None:
        self.config = config
        self._run = run
        self._jobs: Retention[JobRun] = Retention(config, "execute_code", "job")

    def start(self, args: CallArgs, owner: Any) -> JobRun:
        """Start ``args`` as a job on the running loop (the caller has bound the runner)."""
        job = JobRun(new_task_id(), self.config.max_output_bytes)
        job_args = replace(
            args,
            job=True,
            abort=job.abort,
            on_output=job.tee("output", args.on_output),
            on_update=job.tee("notify", args.on_update),
            on_text=job.tee("text", None),
            on_start=job.started,
        )
        self._jobs.add(job)
        job.task = asyncio.get_running_loop().create_task(
            self._drive(job, job_args, owner), name=f"lemon-exec-job-{job.id}"
        )
        return job

    async def _drive(self, job: JobRun, args: CallArgs, owner: Any) -> None:
        try:
            if job.abort.is_set():  # cancelled before its task first ran
                details = {**base_details(self.config.mode), "cancelled": True}
                result = refusal(CANCELLED_BEFORE_START, {**details, "never_started": True})
            else:
                result = await self._run(args, owner)
        except asyncio.CancelledError:
            job.finish(refusal(CANCELLED_BEFORE_START, {"cancelled": True}))
            raise
        except Exception as exc:  # a host fault: the job still ends, saying so
            log.exception("execute_code: job %s failed in the host", job.id)
            result = refusal(f"execute_code: the job failed in the host: {exc}", {})
        job.finish(result)
        self._jobs.ended()  # expires what is due, and times the next expiry

    def get(self, job_id: str) -> JobRun:
        """The job ``job_id``; ``JobExpiredError`` once expired, ``KeyError`` if unknown."""
        return self._jobs.get(job_id)

    def list(self) -> list[JobRun]:
        """Live jobs and finished ones not yet expired, in start order."""
        return self._jobs.list()

    def prune(self) -> None:
        """Expire finished jobs past ``job_result_ttl_ms`` or beyond ``max_finished_jobs``."""
        self._jobs.prune()

    async def aclose(self) -> None:
        """Cancel every live job and wait (bounded) for each to end through its abort path."""
        jobs = self._jobs.list()
        tasks = [j.task for j in jobs if j.task is not None and not j.done]
        for job in jobs:
            job.abort.set()
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_GRACE_S)

    async def settle(self) -> None:
        """After the host is closed: the jobs still running end now (their kernels are gone)."""
        jobs = self._jobs.list()
        tasks = [j.task for j in jobs if j.task is not None and not j.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=CANCEL_GRACE_S)
        late = [task for task in tasks if not task.done()]
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
