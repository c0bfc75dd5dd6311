"""The seam between MCP tasks and what runs them: a task source and its jobs.

:mod:`~lemon_exec.mcp._tasks` serves the ``tasks/*`` protocol once, for every tool that can run
as a task; each such tool brings a :class:`TaskSource` (execute_code: the facade's jobs,
:mod:`~lemon_exec.mcp._code_tasks`; execute_command: the shell session's commands,
:mod:`~lemon_exec.mcp._shell_tasks`). A source also keeps its finished tasks for the expiry
rules (``job_result_ttl_ms``, ``max_finished_jobs``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from mcp_types import CallToolResult

__all__ = ["TaskJob", "TaskSource"]


class TaskJob(Protocol):
    """One task's work, whatever runs it. ``state`` is in the jobs' vocabulary (queued,
    running, completed, failed, cancelled, timed_out, expired: :data:`JobState`)."""

    @property
    def id(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def done(self) -> bool: ...

    def headline(self) -> str:
        """One line on how it ended ('' while it runs)."""
        ...

    async def wait(self) -> None:
        """Until it has ended (also once expired)."""
        ...

    async def payload(self) -> CallToolResult:
        """Once ended: the ``CallToolResult`` a blocking call gives; ``JobExpiredError``."""
        ...

    async def cancel(self) -> None:
        """Stop it (a queued one never runs) and wait until it has ended."""
        ...


class TaskSource(Protocol):
    """Where the tasks of some tools come from, and are kept until they expire."""

    @property
    def tools(self) -> frozenset[str]: ...

    async def start(
        self, arguments: Mapping[str, Any], on_update: Callable[[str], None]
    ) -> TaskJob:
        """Start a call with these arguments; ``MCPError`` if it cannot start."""
        ...

    def get(self, task_id: str) -> TaskJob:
        """``JobExpiredError`` once expired, ``KeyError`` if unknown (expires what is due)."""
        ...

    def list(self) -> Sequence[TaskJob]:
        """Live tasks and finished ones not yet expired."""
        ...

    async def aclose(self) -> None:
        """The serving period is over: stop what still runs."""
        ...
