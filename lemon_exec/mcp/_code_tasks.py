"""execute_code as an MCP task source: a task is a job of the serving period's facade.

:meth:`ExecuteCode.start` is the facade's one way to run a call in the background; the job's
id is the task id, its result's MCP form (:func:`~lemon_exec.mcp._calls.code_result`) the
task's payload, and the facade's job table keeps and expires it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, CallToolResult

from lemon_exec.errors import JobExpiredError, LemonExecError
from lemon_exec.facade import ExecuteCode
from lemon_exec.jobs import Job
from lemon_exec.mcp._calls import code_arguments, code_result
from lemon_exec.scope import SessionScope

__all__ = ["CodeTask", "CodeTasks"]

log = logging.getLogger(__name__)


class CodeTask:
    """A :class:`~lemon_exec.mcp._task_source.TaskJob` over an execute_code :class:`Job`."""

    def __init__(self, job: Job) -> None:
        self.job = job

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def state(self) -> str:
        return self.job.state

    @property
    def done(self) -> bool:
        return self.job.done

    def headline(self) -> str:
        result = self.job.result
        return "" if result is None else result.content.strip().split("\n", 1)[0]

    async def wait(self) -> None:
        with contextlib.suppress(JobExpiredError):
            await self.job.wait()

    async def payload(self) -> CallToolResult:
        return code_result(await self.job.wait())

    async def cancel(self) -> None:
        await self.job.cancel()


class CodeTasks:
    """The execute_code task source of one serving period (its facade, its session scope)."""

    tools = frozenset({"execute_code"})

    def __init__(self, facade: ExecuteCode, scope: SessionScope) -> None:
        self.facade = facade
        self.scope = scope

    async def start(
        self, arguments: Mapping[str, Any], on_update: Callable[[str], None]
    ) -> CodeTask:
        try:
            script, timeout_ms, reset = code_arguments(arguments)
        except ToolError as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
        try:
            job = await self.facade.start(
                script, timeout_ms=timeout_ms, reset=reset, scope=self.scope, on_update=on_update
            )
        except LemonExecError as exc:
            log.warning("execute_code task not started", exc_info=exc)
            raise MCPError(code=INTERNAL_ERROR, message=str(exc)) from exc
        return CodeTask(job)

    def get(self, task_id: str) -> CodeTask:
        return CodeTask(self.facade.job(task_id))

    def list(self) -> list[CodeTask]:
        return [CodeTask(job) for job in self.facade.jobs()]

    async def aclose(self) -> None:
        """Nothing: closing the facade ends its jobs (the serving period does that first)."""
