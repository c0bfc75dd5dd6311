"""MCP tasks through the official SDK client: the requests a task-aware client sends.

The SDK (2.3) ships the 2025-11-25 task types but no client helpers, so these are the raw
requests. ``tasks/*`` go through ``ClientSession.send_request`` (not spec methods, so only the
result type given here is checked). A task-augmented ``tools/call`` goes through the session's
dispatcher instead: ``send_request`` checks every ``tools/call`` result against
``CallToolResult``, which a ``CreateTaskResult`` is not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio
from mcp import Client
from mcp.client.extension import ClientExtension, NotificationBinding
from mcp_types import (
    CallToolRequest,
    CallToolRequestParams,
    CallToolResult,
    CancelTaskRequest,
    CancelTaskRequestParams,
    CancelTaskResult,
    CreateTaskResult,
    GetTaskPayloadRequest,
    GetTaskPayloadRequestParams,
    GetTaskRequest,
    GetTaskRequestParams,
    GetTaskResult,
    ListTasksRequest,
    ListTasksResult,
    PaginatedRequestParams,
    RequestParamsMeta,
    Task,
    TaskMetadata,
    TaskStatusNotificationParams,
)

RELATED_TASK = "io.modelcontextprotocol/related-task"


class StatusWatch(ClientExtension):
    """Collects ``notifications/tasks/status`` (the SDK client drops unknown notifications)."""

    identifier = "test.lemon-exec/task-status"

    def __init__(self) -> None:
        self.seen: list[TaskStatusNotificationParams] = []

    def notifications(self) -> Sequence[NotificationBinding[Any]]:
        return (
            NotificationBinding(
                method="notifications/tasks/status",
                params_type=TaskStatusNotificationParams,
                handler=self._seen,
            ),
        )

    async def _seen(self, params: TaskStatusNotificationParams) -> None:
        self.seen.append(params)

    def final(self, task_id: str) -> TaskStatusNotificationParams | None:
        for params in self.seen:
            if params.task_id == task_id:
                return params
        return None


async def start_task(
    client: Client,
    arguments: dict[str, Any],
    *,
    progress_token: str | None = None,
    tool: str = "execute_code",
) -> Task:
    """A task-augmented ``tools/call`` of ``tool``; the created task."""
    meta = RequestParamsMeta(progress_token=progress_token) if progress_token else None
    request = CallToolRequest(
        params=CallToolRequestParams(
            name=tool, arguments=arguments, task=TaskMetadata(ttl=60_000), _meta=meta
        )
    )
    params = request.model_dump(by_alias=True, mode="json", exclude_none=True)["params"]
    raw = await client.session._dispatcher.send_raw_request("tools/call", params, None)
    return CreateTaskResult.model_validate(raw).task


async def get_task(client: Client, task_id: str) -> GetTaskResult:
    request = GetTaskRequest(params=GetTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, GetTaskResult)


async def task_result(client: Client, task_id: str) -> CallToolResult:
    request = GetTaskPayloadRequest(params=GetTaskPayloadRequestParams(task_id=task_id))
    return await client.session.send_request(request, CallToolResult)


async def cancel_task(client: Client, task_id: str) -> CancelTaskResult:
    request = CancelTaskRequest(params=CancelTaskRequestParams(task_id=task_id))
    return await client.session.send_request(request, CancelTaskResult)


async def list_tasks(client: Client, cursor: str | None = None) -> ListTasksResult:
    request = ListTasksRequest(params=PaginatedRequestParams(cursor=cursor))
    return await client.session.send_request(request, ListTasksResult)


async def until(check: Callable[[], Awaitable[bool]], within: float = 30.0) -> None:
    """Poll an async check (a ``tasks/get``, say) until it holds."""
    with anyio.fail_after(within):
        while not await check():
            await anyio.sleep(0.05)
