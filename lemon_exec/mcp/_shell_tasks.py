"""execute_command as an MCP task source: the server's shell session runs the command in an
asyncio task the server owns.

The command runs exactly as a blocking call's does (:meth:`ShellSession.aexecute_command`,
the same timeout and ceiling, the session's lock, its sandbox); the task only holds on to the
result. A task waiting for the session's lock is ``queued``; once the command has the session
it is ``running``. ``cancel`` sets the command's cancel event, the one the shell checks while
it waits for the lock and while the command runs (it kills the process tree, as at the
timeout): a queued command never runs, a running one ends with ``exit_code`` -1 and its
output so far. Finished tasks are kept and expire by the jobs' rules
(:class:`~lemon_exec.host.run.retention.Retention`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, CallToolResult

from lemon_exec.config import ExecuteCodeConfig
from lemon_exec.errors import JobExpiredError
from lemon_exec.host.run.jobs import CANCEL_GRACE_S, FINISHED, JobState, new_task_id
from lemon_exec.host.run.retention import Retention
from lemon_exec.mcp._calls import command_arguments, command_result
from lemon_exec.shell import CommandResult, ShellSession

__all__ = ["ShellTask", "ShellTasks"]

log = logging.getLogger(__name__)

_STOPPED = "Command stopped: the server is shutting down.\n"


class ShellTask:
    """One execute_command task (a :class:`~lemon_exec.mcp._task_source.TaskJob`)."""

    def __init__(self, task_id: str) -> None:
        self.id = task_id
        self.state: JobState = "queued"
        self.finished_at: float | None = None  # time.monotonic() when it ended
        self.result: CommandResult | None = None
        self.cancel_event = threading.Event()  # the shell polls it: waiting and running
        self.task: asyncio.Task[None] | None = None
        self._done = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.state in FINISHED

    def started(self) -> None:
        """The command has the session (called in the shell's worker thread)."""
        if self.state == "queued":
            self.state = "running"

    def finish(self, result: CommandResult) -> None:
        self.result = result
        self.state = _state_of(result, cancelled=self.cancel_event.is_set())
        self.finished_at = time.monotonic()
        self._done.set()

    def expire(self) -> None:
        self.state = "expired"
        self.result = None

    def headline(self) -> str:
        result = self.result
        if result is None:
            return ""
        if result["timed_out"]:
            return "timed out"
        if result["exit_code"] != -1:
            return f"exit code {result['exit_code']}"
        lines = [line for line in result["stderr"].splitlines() if line.strip()]
        return lines[-1] if lines else "exit code -1"

    async def wait(self) -> None:
        await self._done.wait()

    async def payload(self) -> CallToolResult:
        await self._done.wait()
        if self.result is None:
            raise JobExpiredError(f"execute_command: task {self.id} has expired")
        return command_result(self.result)

    async def cancel(self) -> None:
        if not self._done.is_set():
            self.cancel_event.set()
            await self._done.wait()


class ShellTasks:
    """The execute_command task source of one serving period, on the server's shell."""

    tools = frozenset({"execute_command"})

    def __init__(self, shell: ShellSession, config: ExecuteCodeConfig) -> None:
        self.shell = shell
        self._tasks: Retention[ShellTask] = Retention(config, "execute_command", "task")

    async def start(
        self, arguments: Mapping[str, Any], on_update: Callable[[str], None]
    ) -> ShellTask:
        """Start the command (``on_update`` is unused: a command sends no progress)."""
        try:
            command, timeout = command_arguments(arguments)
        except ToolError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        task = ShellTask(new_task_id())
        self._tasks.add(task)
        task.task = asyncio.get_running_loop().create_task(
            self._drive(task, command, timeout), name=f"lemon-exec-shell-task-{task.id}"
        )
        return task

    async def _drive(self, task: ShellTask, command: str, timeout: float | None) -> None:
        try:
            result = await self.shell.aexecute_command(
                command, timeout, cancel_event=task.cancel_event, on_start=task.started
            )
        except asyncio.CancelledError:  # the server stopped it past its grace
            task.finish(CommandResult(stdout="", stderr=_STOPPED, exit_code=-1, timed_out=False))
            raise
        except Exception as exc:  # the shell failing, not the command: the task still ends
            log.exception("execute_command: task %s failed in the server", task.id)
            message = f"Error: the command failed in the server: {exc}\n"
            result = CommandResult(stdout="", stderr=message, exit_code=-1, timed_out=False)
        task.finish(result)
        self._tasks.ended()  # expires what is due, and times the next expiry

    def get(self, task_id: str) -> ShellTask:
        return self._tasks.get(task_id)

    def list(self) -> list[ShellTask]:
        return self._tasks.list()

    async def aclose(self) -> None:
        """Stop the commands still queued or running, as a cancel does (bounded wait)."""
        live = [t for t in self._tasks.list() if not t.done]
        for task in live:
            task.cancel_event.set()
        runs = [t.task for t in live if t.task is not None]
        if not runs:
            return
        _, late = await asyncio.wait(runs, timeout=CANCEL_GRACE_S)
        for run in late:
            run.cancel()
        await asyncio.gather(*late, return_exceptions=True)


def _state_of(result: CommandResult, *, cancelled: bool) -> JobState:
    """A command's state: an exit status of 0 completes it, as an ``ok`` script does."""
    if result["timed_out"]:
        return "timed_out"
    if result["exit_code"] == -1 and cancelled:
        return "cancelled"
    return "completed" if result["exit_code"] == 0 else "failed"
